"""The senders of ``on_locked="rerun"``: each framework's way to send a skipped task call
once more (``api.rerun``).

Installed when the app is ready (:func:`install`), for every framework at
once: each looks for its framework among the modules already imported
(``sys.modules``), never importing one. ``describe`` gives the call of a task
of it running now (name and arguments, as JSON); ``send`` enqueues such a
call, in the holder's process. A framework without a sender here leaves the
holder to run its own work again, in-line.
"""

from __future__ import annotations

import sys
from typing import Any

from django_tasklock.api.rerun import Sender, register_sender


def _celery_task() -> Any:
    """The Celery task a worker runs now (``called_directly``: none), or None."""
    task: Any = getattr(sys.modules.get("celery"), "current_task", None)
    return task if task and not task.request.called_directly else None


def celery_describe() -> dict[str, Any] | None:
    """Celery: the running task's name and arguments (``request.args``, ``request.kwargs``)."""
    task = _celery_task()
    if task is None:
        return None
    request = task.request
    return {"task": task.name, "args": list(request.args or ()), "kwargs": request.kwargs or {}}


def celery_send(call: dict[str, Any]) -> None:
    """Celery: ``send_task`` by name on the current app (routed as the app routes it)."""
    app: Any = sys.modules["celery"].current_app
    app.send_task(call["task"], args=call["args"], kwargs=call["kwargs"])


SENDERS: tuple[Sender, ...] = (Sender("Celery", celery_describe, celery_send),)


def install() -> None:
    """Register every framework's sender (the app's ``ready()`` does)."""
    for sender in SENDERS:
        register_sender(sender)
