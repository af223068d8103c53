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

from django_tasklock.api.retrying import Retrier, RetryBackoff, RetryPlan, register
from django_tasklock.contrib import running


def celery(backoff: RetryBackoff) -> RetryPlan | None:
    """Celery: ``task.retry(countdown=..., max_retries=...)``, which raises ``Retry``.

    A task run by a worker only (``called_directly``: the function called as a
    function is no task run). ``request.retries`` counts the retries so far.
    """
    task = running.celery_task()
    if task is None:
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
    job = running.rq_job()
    if job is None or not hasattr(job, "number_of_retries"):
        return None
    attempt = int(job.number_of_retries or 0) + 1
    if attempt >= backoff.tries:
        return RetryPlan("RQ", attempt, None, lambda: None)
    interval = max(1, math.ceil(backoff.countdown(attempt)))  # RQ schedules whole seconds
    retry = sys.modules["rq"].Retry

    def act() -> Any:
        return retry(max=backoff.tries - 1, interval=interval)

    return RetryPlan("RQ", attempt, float(interval), act)


def dramatiq(backoff: RetryBackoff) -> RetryPlan | None:
    """Dramatiq: ``raise dramatiq.Retry(delay=<ms>)``, sent again by the ``Retries`` middleware.

    The message running is Dramatiq's ``CurrentMessage`` middleware's, or
    else the one our ``TaskLock`` middleware notes (``contrib.dramatiq``);
    with neither on the broker, none is known. ``message.options["retries"]``
    counts the retries so far. The try at which the ``Retries`` middleware
    would fail the message instead (the message's or actor's ``max_retries``
    used up), or where the broker has no ``Retries``, ends as skipped.
    """
    message = running.dramatiq_message()
    if message is None:
        return None
    module: Any = sys.modules["dramatiq"]
    retries = int(message.options.get("retries", 0))
    attempt = retries + 1
    most = _dramatiq_max_retries(message)
    if attempt >= backoff.tries or (most is not None and retries >= most):
        return RetryPlan("Dramatiq", attempt, None, lambda: None)
    countdown = backoff.countdown(attempt)

    def act() -> Any:
        raise module.Retry("its task lock is held elsewhere", delay=round(countdown * 1000))

    return RetryPlan("Dramatiq", attempt, countdown, act)


def _dramatiq_max_retries(message: Any) -> int | None:
    """How many retries the ``Retries`` middleware allows ``message`` (0: it has none).

    None when it cannot be told (no global broker, an unknown actor, a
    ``retry_when`` deciding instead): then only the backoff's tries count.
    """
    broker: Any = getattr(sys.modules.get("dramatiq.broker"), "global_broker", None)
    retries_module: Any = sys.modules.get("dramatiq.middleware.retries")
    if broker is None or retries_module is None:
        return None
    middleware = [m for m in broker.middleware if isinstance(m, retries_module.Retries)]
    if not middleware:
        return 0
    try:
        actor = broker.get_actor(message.actor_name)
    except Exception:  # ActorNotFound: an actor of another broker
        return None
    if actor.options.get("retry_when", middleware[0].retry_when) is not None:
        return None
    most = message.options.get(
        "max_retries", actor.options.get("max_retries", middleware[0].max_retries)
    )
    return None if most is None else int(most)


def huey(backoff: RetryBackoff) -> RetryPlan | None:
    """Huey: ``raise RetryTask(delay=<s>)`` (``contrib.huey.HeldRetry``), which requeues the task.

    The task running is known where ``contrib.huey.track_tasks(HUEY)`` (or
    ``install(HUEY)``) registered its hooks; its tries are counted in the
    Huey's storage, ``RetryTask`` leaving ``task.retries`` untouched.
    """
    found = running.huey_task()
    if found is None:
        return None
    instance, task = found
    module: Any = sys.modules["django_tasklock.contrib.huey"]
    key = module.tries_key(task)
    attempt = int(instance.storage.incr(key))
    if attempt >= backoff.tries:
        instance.storage.delete_counter(key)
        return RetryPlan("Huey", attempt, None, lambda: None)
    countdown = backoff.countdown(attempt)

    def act() -> Any:
        raise module.HeldRetry("its task lock is held elsewhere", delay=countdown)

    return RetryPlan("Huey", attempt, countdown, act)


RETRIERS: tuple[Retrier, ...] = (celery, rq, dramatiq, huey)


def install() -> None:
    """Register every framework's retrier (the app's ``ready()`` does)."""
    for retrier in RETRIERS:
        register(retrier)
