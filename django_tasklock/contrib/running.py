"""The task each framework runs now in this thread: what ``on_locked="retry"``'s retriers
(``contrib.retries``) and ``"rerun"``'s senders (``contrib.reruns``) both look for.

Each looks for its framework among the modules already imported
(``sys.modules``), never importing one, and answers None where it is not
there or runs no task of it here.
"""

from __future__ import annotations

import sys
from typing import Any


def celery_task() -> Any:
    """The Celery task a worker runs now, or None (``called_directly``: the function
    called as a function is no task run)."""
    task: Any = getattr(sys.modules.get("celery"), "current_task", None)
    return task if task and not task.request.called_directly else None


def rq_job() -> Any:
    """RQ's current job (``rq.get_current_job()``), or None."""
    get_current_job: Any = getattr(sys.modules.get("rq"), "get_current_job", None)
    return get_current_job() if get_current_job is not None else None


def dramatiq_message() -> Any:
    """The Dramatiq message whose actor this thread runs now, or None: Dramatiq's
    ``CurrentMessage`` middleware's, else the one our ``TaskLock`` middleware notes
    (``contrib.dramatiq.current_message``); with neither on the broker, none is known."""
    if "dramatiq" not in sys.modules:
        return None
    message: Any = None
    current: Any = sys.modules.get("dramatiq.middleware.current_message")
    if current is not None:
        message = current.CurrentMessage.get_current_message()
    ours: Any = sys.modules.get("django_tasklock.contrib.dramatiq")
    if message is None and ours is not None:
        message = ours.current_message()
    return message


def huey_task() -> tuple[Any, Any] | None:
    """The Huey instance and the task its consumer runs in this thread, or None: known
    where ``contrib.huey.track_tasks`` (or ``install``) hooked the consumer."""
    module: Any = sys.modules.get("django_tasklock.contrib.huey")
    return module.current_task() if module is not None else None
