"""The retriers of ``on_locked="retry"``: each framework's own retry of a task (``api.retrying``).

Installed when the app is ready (:func:`install`), for every framework at
once: each looks for its framework among the modules already imported
(``sys.modules``), never importing one, and for a task of it running now.
A framework without a retry of its own (Django's tasks, django-q2) has none.
"""

from __future__ import annotations

import sys
from typing import Any

from django_tasklock.api.retrying import RetryBackoff, RetryPlan, register


def celery(backoff: RetryBackoff) -> RetryPlan | None:
    """Celery: ``task.retry(countdown=..., max_retries=...)``, which raises ``Retry``.

    A task run by a worker only (``called_directly``: the function called as a
    function is no task run). ``request.retries`` counts the retries so far.
    """
    module = sys.modules.get("celery")
    task: Any = getattr(module, "current_task", None)
    if not task or task.request.called_directly:
        return None
    attempt = int(task.request.retries or 0) + 1
    if attempt >= backoff.tries:
        return RetryPlan("Celery", attempt, None, lambda: None)
    countdown = backoff.countdown(attempt)

    def act() -> Any:
        raise task.retry(countdown=countdown, max_retries=backoff.tries - 1)

    return RetryPlan("Celery", attempt, countdown, act)


RETRIERS = (celery,)


def install() -> None:
    """Register every framework's retrier (the app's ``ready()`` does)."""
    for retrier in RETRIERS:
        register(retrier)
