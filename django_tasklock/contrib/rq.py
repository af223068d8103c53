"""``@exclusive`` for RQ jobs (``rq``, ``django-rq``): a skipped job says so in its meta.

A job whose key is held does not run its function and finishes with the
result ``None`` (or ``on_locked``'s value), as under the core decorator; in
RQ that is a *finished* job like any other, so this decorator also writes
``job.meta["tasklock"] = {"skipped": True, "key": ...}`` to the job, so that
whoever reads the job can tell a skipped one from one that ran and returned
``None``.

This is run-time exclusion: the job was queued and a worker took it. RQ's
``unique`` (enqueue-time) refuses to *enqueue* a job while one of the same id
exists in Redis; it does not stop two runs of one function with different ids.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, overload

from asgiref.sync import iscoroutinefunction

from django_tasklock.api.decorators import Decorator, OnLost
from django_tasklock.api.decorators import exclusive as core_exclusive
from django_tasklock.api.service import TaskLockService
from django_tasklock.contrib import require
from django_tasklock.locking.callables import validate_callable
from django_tasklock.locking.keys import KeyBuilder, KeySpec
from django_tasklock.locking.options import LockKwargs

require("rq")

from rq import get_current_job  # noqa: E402
from rq.job import Job  # noqa: E402

if TYPE_CHECKING:
    from typing_extensions import Unpack

P = ParamSpec("P")
R = TypeVar("R")

#: The key of ``job.meta`` that says a job was skipped, and for which lock key.
META_KEY = "tasklock"

__all__ = ["META_KEY", "exclusive"]


@overload
def exclusive(func: Callable[P, R], /) -> Callable[P, R | None]: ...
@overload
def exclusive(
    key: str | None = None,
    /,
    *,
    on_locked: Callable[..., Any] | Literal["rerun", "retry"] | None = None,
    on_lost: OnLost = "continue",
    service: TaskLockService | None = None,
    **options: Unpack[LockKwargs],
) -> Decorator: ...
@overload
def exclusive(
    *,
    key: KeySpec,
    on_locked: Callable[..., Any] | Literal["rerun", "retry"] | None = None,
    on_lost: OnLost = "continue",
    service: TaskLockService | None = None,
    **options: Unpack[LockKwargs],
) -> Decorator: ...
def exclusive(
    target: Any = None,
    /,
    *,
    key: KeySpec = None,
    on_locked: Callable[..., Any] | Literal["rerun", "retry"] | None = None,
    on_lost: OnLost = "continue",
    service: TaskLockService | None = None,
    **options: Unpack[LockKwargs],
) -> Any:
    """:func:`django_tasklock.exclusive` for an RQ job function; put ``@job`` above it.

    Takes the same arguments. When the key is held, the job's function does
    not run, the job finishes with ``on_locked(*args, **kwargs)``'s value
    (``None`` without it), and ``job.meta["tasklock"]`` is
    ``{"skipped": True, "key": <the key>}``, saved to Redis. Outside a job
    (a direct call) it is :func:`django_tasklock.exclusive`.

    A job that holds its key and runs has no ``"tasklock"`` entry: a mark
    left by an earlier, skipped run of the same job (RQ's ``Retry``,
    ``requeue()``, ``Repeat``) is taken off. Only the job whose function this
    is is marked, not one whose function calls it.

    ``on_locked="rerun"`` and ``on_locked="retry"`` are the core's (the
    latter returns RQ's ``Retry``: it needs a worker started with
    ``--with-scheduler``); a job they skip gets no ``"tasklock"`` mark.

    RQ's ``@job`` below it is a ``TypeError``: the worker would run the
    function without the lock.
    """
    if target is not None and not isinstance(target, str):
        refuse_rq_job(target)
        if key is not None or not callable(target) or target.__name__ == "<lambda>":
            # Bad arguments: the core says which, in its words.
            return core_exclusive(target, key=key)  # type: ignore[call-overload]
        return exclusive(on_locked=on_locked, on_lost=on_lost, service=service, **options)(target)
    spec: KeySpec = target if target is not None else key
    if target is not None and key is not None:
        core_exclusive(target, key=key)  # type: ignore[call-overload]  # raises: the key twice
    if isinstance(on_locked, str):
        # "rerun" and "retry" are the core's (checked there): a job they skip
        # either runs once more in its holder or is retried, and gets no mark.
        core = core_exclusive(
            key=spec, on_locked=on_locked, on_lost=on_lost, service=service, **options
        )

        def decorate_core(func: Callable[..., Any]) -> Callable[..., Any]:
            refuse_rq_job(func)
            return core(unmarking(func))

        return decorate_core
    validate_callable("on_locked", on_locked, optional=True)
    # Checks every option now, as the core does.
    core_exclusive(key=spec, on_lost=on_lost, service=service, **options)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        refuse_rq_job(func)
        build_key = KeyBuilder(func, spec)

        def held(*args: Any, **kwargs: Any) -> Any:
            mark_skipped(func, build_key(args, kwargs))
            return None if on_locked is None else on_locked(*args, **kwargs)

        return core_exclusive(
            key=spec, on_locked=held, on_lost=on_lost, service=service, **options
        )(unmarking(func))

    return decorate


def unmarking(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, first taking an earlier run's skip mark off the job's meta.

    The same job (same id) runs again after RQ's ``Retry``, ``requeue()`` or
    ``Repeat``: once it holds its key, its meta must not say it was skipped.
    """
    if iscoroutinefunction(func):

        @functools.wraps(func)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            unmark_skipped(func)
            return await func(*args, **kwargs)

        return run_async

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        unmark_skipped(func)
        return func(*args, **kwargs)

    return run


def mark_skipped(func: Callable[..., Any], key: str) -> None:
    """Write ``{"skipped": True, "key": key}`` to the meta of the job running ``func``."""
    job = job_running(func)
    if job is not None:
        job.meta[META_KEY] = {"skipped": True, "key": key}
        job.save_meta()  # type: ignore[no-untyped-call]


def unmark_skipped(func: Callable[..., Any]) -> None:
    """Take the skip mark off the meta of the job running ``func``, if a run left one."""
    job = job_running(func)
    if job is not None and META_KEY in job.meta:
        del job.meta[META_KEY]
        job.save_meta()  # type: ignore[no-untyped-call]


def job_running(func: Callable[..., Any]) -> Job | None:
    """The current job if its function is ``func`` (under its decorators), else None.

    A job whose function merely calls ``func`` was not skipped when that call was.
    """
    job = get_current_job()
    if job is None:
        return None
    if job.func_name == f"{func.__module__}.{func.__qualname__}":
        return job
    try:
        target = job.func
    except Exception:  # pragma: no cover - the worker imported it to run the job
        return None
    while target is not None:  # another import path to the same function
        if target is func:
            return job
        target = getattr(target, "__wrapped__", None)
    return None


def refuse_rq_job(func: object) -> None:
    """RQ's ``@job`` (or django-rq's) below ``@exclusive``: the worker would not lock."""
    # rq.decorators.job returns the function itself, with ``delay`` (and ``enqueue``)
    # set to an enqueuer that wraps it: recognised without looking at modules.
    delay = getattr(func, "delay", None)
    if delay is not None and getattr(delay, "__wrapped__", None) is func:
        raise TypeError(
            "@exclusive is above RQ's @job: put @job above @exclusive, so that the worker "
            "runs the locked function"
        )
