"""``@exclusive``: run a function, view or task only while nobody else holds its key."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack, ExitStack
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, cast, overload

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from django_tasklock.api.rerun import (
    ACQUIRED,
    arun_marked,
    as_body,
    atake_or_mark,
    check_rerun,
    run_marked,
    take_or_mark,
    wants_rerun,
)
from django_tasklock.api.retrying import retry_later
from django_tasklock.api.service import TaskLockService, lock
from django_tasklock.api.skipped import RETRY, report_skipped
from django_tasklock.exceptions import LockNotAcquired
from django_tasklock.locking import loss
from django_tasklock.locking.aio import off_loop
from django_tasklock.locking.callables import refuse_coroutine, validate_callable
from django_tasklock.locking.keys import KeyBuilder, KeySpec, default_key
from django_tasklock.locking.lock import Lock
from django_tasklock.locking.options import LockKwargs, check_lock_kwargs

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from django_tasklock.holders import HeldLock

P = ParamSpec("P")
R = TypeVar("R")
Resp = TypeVar("Resp", bound=HttpResponseBase)

#: The body of the 409 a view gets while its key is held.
CONFLICT_MESSAGE = "409 Conflict: this is already running; try again later.\n"

OnLost = Literal["continue", "raise"]
ON_LOST: tuple[OnLost, ...] = ("continue", "raise")


class Decorator(Protocol):
    """What ``exclusive(...)`` returns: views keep their type, other results may be None."""

    @overload
    def __call__(
        self, func: Callable[P, Coroutine[Any, Any, Resp]], /
    ) -> Callable[P, Coroutine[Any, Any, Resp]]: ...
    @overload
    def __call__(
        self, func: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R | None]]: ...
    @overload
    def __call__(self, func: Callable[P, Resp], /) -> Callable[P, Resp]: ...
    @overload
    def __call__(self, func: Callable[P, R], /) -> Callable[P, R | None]: ...


#: Lock options the decorator does not take, and its own keywords besides them.
_REFUSED = frozenset({"cancel_on_loss"})
_OWN = frozenset({"key", "on_locked", "on_lost", "service"})


@overload
def exclusive(
    func: Callable[P, Coroutine[Any, Any, Resp]], /
) -> Callable[P, Coroutine[Any, Any, Resp]]: ...
@overload
def exclusive(
    func: Callable[P, Coroutine[Any, Any, R]], /
) -> Callable[P, Coroutine[Any, Any, R | None]]: ...
@overload
def exclusive(func: Callable[P, Resp], /) -> Callable[P, Resp]: ...
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
    """Run the decorated function only while nobody else holds its key.

    Usable bare (``@exclusive``: the key is ``"module.QualifiedName"``) or
    called: ``@exclusive("community-pr:{work.id}", ttl=600)``. The key is a
    ``str.format`` template over the call's arguments (defaults applied;
    attribute and index access such as ``{request.user.pk}`` work), or a
    callable taking the same arguments, passed as ``key=``. A template that
    names something the function has no parameter for is a ``ValueError``
    at decoration; one that cannot be rendered from a call's arguments is a
    ``ValueError`` at that call, naming what was missing.

    When another holder has the key, the function does not run, and the call
    returns ``on_locked(*args, **kwargs)``'s value when given (awaited if it
    is awaitable, in an ``async def``); else, for a Django view (a call with
    an ``HttpRequest`` argument), a ``409 Conflict`` plain-text response;
    else ``None``. With ``on_locked="rerun"``, a skipped call marks the key
    instead, and returns as skipped: the call holding the key runs the
    function once more, with its own arguments, when its run ends (however
    many calls were skipped meanwhile), or, where the skipped call ran in a
    task its framework's integration can send again, sends the latest such
    call once more (see docs/rerun.md). With
    ``on_locked="retry"``, a task's call asks its framework (Celery, RQ 2.1+,
    Dramatiq, Huey) to run the task again later, after a jittered countdown
    that doubles per try (``api.retrying.RetryBackoff``); its last try ends as
    skipped; outside such a task it raises ``RetryUnavailable``. With
    ``limit=N`` (``@exclusive("export:{tenant_id}", limit=3)``), up to N
    calls per rendered key run at once, each under one of its permits, and a
    call finding all N held is skipped the same way.

    ``async def`` functions get an ``async def`` wrapper (decided now, not
    per call); the wrapper keeps the function's name, docstring, signature
    and ``__wrapped__``. Lock options (``ttl``, ``refresh_interval``,
    ``max_lifetime``, ``wait``, ``min_hold``, ``fencing``,
    ``progress_timeout``, ``limit``, ``name``) are those of ``TaskLockService.lock``
    (``name`` defaults to the key template, or the function's dotted name for a
    key function: telemetry never reports a rendered key): an unknown
    one is a ``TypeError`` now, bad values a ``TypeError`` or ``ValueError``
    at each call, before anything is written. ``service`` defaults to the one
    of ``TASKLOCK_BACKEND``. A skipped call logs one INFO line naming the key
    and its holder and sends ``lock_skipped``.

    While the function runs, ``django_tasklock.current_lock()`` is its lock.
    ``on_lost`` says what a loss of it does: ``"continue"`` (the default),
    nothing — the work goes on and ``current_lock().lost`` is True;
    ``"raise"``, the work is stopped with ``LockLost``: a ``def`` function
    at its next ``django_tasklock.checkpoint()`` (or, if it reaches none,
    the call raises ``LockLost`` when it returns), an ``async def`` one by
    cancelling its task at the declaration (``cancel_on_loss``). Either way
    the key is released and the caller gets ``LockLost``.

    A task framework's decorator goes above ``@exclusive``, so that the
    worker runs the locked function; a Celery or Django task given to
    ``exclusive`` is a ``TypeError`` naming that order.
    """
    if target is not None and not isinstance(target, str):
        refuse_task_object(target)
    if callable(target) and not isinstance(target, str):
        if key is not None:
            raise TypeError("exclusive() got a function and key=: pass the key only")
        if getattr(target, "__name__", "") == "<lambda>":
            raise TypeError("a key function is passed as exclusive(key=...), not positionally")
        return exclusive(
            key=None, on_locked=on_locked, on_lost=on_lost, service=service, **options
        )(target)
    if target is not None:
        if key is not None:
            raise TypeError("exclusive() got the key twice: positionally and as key=")
        if not isinstance(target, str):
            raise TypeError(
                f"key must be a str.format template or a callable, not {type(target).__name__}"
            )
        key = target
    retry = on_locked == RETRY
    rerun = not retry and wants_rerun(on_locked)
    if not (rerun or retry):
        validate_callable("on_locked", on_locked, optional=True)
    check_lock_kwargs(options, caller="exclusive()", refused=_REFUSED, own=_OWN)
    if "cancel_on_loss" in options:
        raise TypeError("exclusive() takes on_lost='raise', not cancel_on_loss")
    if not isinstance(on_lost, str) or on_lost not in ON_LOST:
        error = ValueError if isinstance(on_lost, str) else TypeError
        raise error(f"on_lost must be one of {ON_LOST}, not {on_lost!r}")

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        refuse_task_object(func)
        validate_callable("func", func)
        # Telemetry names the lock by its template, never by a rendered key.
        named: LockKwargs = {"name": key if isinstance(key, str) else default_key(func), **options}
        build_key, stop = KeyBuilder(func, key), on_lost == "raise"
        if rerun:
            return _wrap_rerun(func, build_key, named, stop, service)
        when_held = cast("Callable[..., Any] | Literal['retry'] | None", on_locked)
        return _wrap(func, build_key, named, when_held, stop, service)

    return decorate


def refuse_task_object(value: object) -> None:
    """A task object where the function belongs: the decorators are in the wrong order.

    Recognised by what it offers, without importing Celery or the Tasks framework.
    """
    kind = type(value)
    celery_task = callable(getattr(kind, "apply_async", None)) and callable(
        getattr(kind, "delay", None)
    )
    # @shared_task gives a lazy proxy: looking at its attributes would make the task.
    if celery_task or kind.__module__.partition(".")[0] == "celery":
        raise TypeError(
            "@exclusive is above a Celery task: put @shared_task (or @app.task) above "
            "@exclusive, so that the worker runs the locked function"
        )
    if callable(getattr(value, "enqueue", None)) and callable(getattr(value, "func", None)):
        raise TypeError(
            "@exclusive is above a Django task: put @task() above @exclusive, so that the "
            "worker runs the locked function"
        )


def _wrap(
    func: Callable[..., Any],
    build_key: KeyBuilder,
    options: LockKwargs,
    on_locked: Callable[..., Any] | Literal["retry"] | None,
    stop: bool,
    service: TaskLockService | None,
) -> Callable[..., Any]:
    name = f"{func.__module__}.{func.__qualname__}"
    is_async = iscoroutinefunction(func)
    if stop and is_async:
        options = {**options, "cancel_on_loss": True}

    def make_lock(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lock:
        key = build_key(args, kwargs)
        return service.lock(key, **options) if service is not None else lock(key, **options)

    # The exit stacks keep the ``try`` around acquisition only: a LockNotAcquired
    # raised by the function itself (a lock it takes) propagates, it is not "held".
    if is_async:

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            async with AsyncExitStack() as stack:
                held = make_lock(args, kwargs)
                try:
                    await stack.enter_async_context(held)
                except LockNotAcquired:
                    if on_locked == RETRY:
                        return await off_loop(retry_later)(held, name)
                    seen = await off_loop(report_skipped)(held, name)
                    outcome = _when_held(on_locked, args, kwargs, seen)
                    return await outcome if inspect.isawaitable(outcome) else outcome
                return await func(*args, **kwargs)

        return async_wrapper

    advice = "declare it with async def, so that @exclusive holds the lock while it runs"

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with ExitStack() as stack:
            held = make_lock(args, kwargs)
            try:
                stack.enter_context(held)
            except LockNotAcquired:
                if on_locked == RETRY:
                    return retry_later(held, name)
                seen = report_skipped(held, name)
                outcome = _when_held(on_locked, args, kwargs, seen)
                refuse_coroutine("on_locked", outcome, advice=advice)
                return outcome
            context = loss.enter(held, stop=stop)
            try:
                result = func(*args, **kwargs)
            finally:
                loss.leave(context)
            refuse_coroutine(default_key(func), result, advice=advice)
        if stop:  # lost while it ran (or found lost by the release): its result is suspect
            held.raise_if_lost()
        return result

    return wrapper


def _wrap_rerun(
    func: Callable[..., Any],
    build_key: KeyBuilder,
    options: LockKwargs,
    stop: bool,
    service: TaskLockService | None,
) -> Callable[..., Any]:
    """``_wrap`` for ``on_locked="rerun"`` (see ``api.rerun``)."""
    name = f"{func.__module__}.{func.__qualname__}"
    if iscoroutinefunction(func):
        options = {**options, "cancel_on_loss": True} if stop else options

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            held = _make_lock(build_key, options, service, args, kwargs)
            check_rerun(held)
            try:
                outcome = await atake_or_mark(held, name)
            except BaseException:
                if held.held:  # interrupted between the grant and its answer
                    await held.arelease()
                raise
            if outcome != ACQUIRED:
                return _when_held(None, args, kwargs, held.seen)

            async def work() -> Any:
                return await as_body(held, lambda: func(*args, **kwargs))

            return await arun_marked(held, work, name)

        return async_wrapper

    advice = "declare it with async def, so that @exclusive holds the lock while it runs"

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        held = _make_lock(build_key, options, service, args, kwargs)
        check_rerun(held)
        try:
            outcome = take_or_mark(held, name)
        except BaseException:
            if held.held:  # interrupted between the grant and its answer
                held.release()
            raise
        if outcome != ACQUIRED:
            return _when_held(None, args, kwargs, held.seen)

        def work() -> Any:
            context = loss.enter(held, stop=stop)
            try:
                result = func(*args, **kwargs)
            finally:
                loss.leave(context)
            refuse_coroutine(default_key(func), result, advice=advice)
            if stop:  # lost while it ran: its result is suspect
                held.raise_if_lost()
            return result

        return run_marked(held, work, name)

    return wrapper


def _make_lock(
    build_key: KeyBuilder,
    options: LockKwargs,
    service: TaskLockService | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Lock:
    key = build_key(args, kwargs)
    return service.lock(key, **options) if service is not None else lock(key, **options)


def _when_held(
    on_locked: Callable[..., Any] | Literal["retry"] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    seen: HeldLock | None,
) -> Any:
    if callable(on_locked):
        return on_locked(*args, **kwargs)
    if any(isinstance(arg, HttpRequest) for arg in (*args, *kwargs.values())):
        return conflict(seen)
    return None


def conflict(seen: HeldLock | None) -> HttpResponse:
    """The ``409 Conflict`` a view gets while its key is held by ``seen``.

    ``Retry-After``: the seconds the holder's lease had left when it was seen,
    rounded up, at least 1 (1 when the holder had let go by then). A live
    holder's lease is renewed while it works, so it is when a crashed holder's
    key is free at the latest, not a promise.
    """
    response = HttpResponse(CONFLICT_MESSAGE, status=409, content_type="text/plain")
    left = 1 if seen is None else max(1, math.ceil(seen.seconds_left))
    response["Retry-After"] = str(left)
    return response
