"""The retriers of ``on_locked="retry"``: each framework's own retry of a task (``api.retrying``).

Installed when the app is ready (:func:`install`), for every framework at
once: each looks for its framework among the modules already imported
(``sys.modules``), never importing one, and for a task of it running now.
A framework without a retry of its own (Django's tasks, django-q2) has none.
"""

from __future__ import annotations

import math
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


def rq(backoff: RetryBackoff) -> RetryPlan | None:
    """RQ 2.1 or later: the job returns ``rq.Retry(max=..., interval=...)``.

    The worker re-enqueues a job that returned a ``Retry``: with an interval
    (always here: whole seconds, at least 1), it schedules it, and only a
    worker started with ``--with-scheduler`` (``rq worker``, django-rq's
    ``rqworker``) enqueues scheduled jobs when due. ``job.number_of_retries``
    counts the retries asked for by returning ``Retry`` (None before the
    first); an RQ without it has no such retry (None here).
    """
    module = sys.modules.get("rq")
    get_current_job: Any = getattr(module, "get_current_job", None)
    job: Any = get_current_job() if get_current_job is not None else None
    if job is None or not hasattr(job, "number_of_retries"):
        return None
    attempt = int(job.number_of_retries or 0) + 1
    if attempt >= backoff.tries:
        return RetryPlan("RQ", attempt, None, lambda: None)
    interval = max(1, math.ceil(backoff.countdown(attempt)))  # RQ schedules whole seconds
    retry = module.Retry  # type: ignore[union-attr]

    def act() -> Any:
        return retry(max=backoff.tries - 1, interval=interval)

    return RetryPlan("RQ", attempt, float(interval), act)


RETRIERS = (celery, rq)


def install() -> None:
    """Register every framework's retrier (the app's ``ready()`` does)."""
    for retrier in RETRIERS:
        register(retrier)
