"""The lock service: acquire, keep alive while the work runs, release."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, Literal, TypeVar, cast

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
from django_tasklock.api.skipped import RERUN, report_skipped
from django_tasklock.backends import get_backend
from django_tasklock.backends.base import BaseBackend, HeldLock
from django_tasklock.exceptions import LockNotAcquired
from django_tasklock.leases.tokens import new_token as new_token
from django_tasklock.locking import loss
from django_tasklock.locking.aio import off_loop, refuse_event_loop
from django_tasklock.locking.callables import (
    awaited,
    refuse_coroutine,
    validate_callable,
    validate_sync_callable,
)
from django_tasklock.locking.lock import Lock
from django_tasklock.locking.options import validate_key

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from django_tasklock.locking.options import LockKwargs

T = TypeVar("T")

_ASYNC_ADVICE = (
    "use arun_exclusive(), which awaits what it returns (an async def, or a lambda or "
    "functools.partial returning a coroutine)"
)


@dataclasses.dataclass(frozen=True)
class LockResult(Generic[T]):
    """What :meth:`TaskLockService.run_exclusive` did.

    ``acquired``: this caller held the lock and ``fn`` ran (False: ``fn`` never ran).
    ``result``: ``fn``'s return value when acquired, else None.
    ``lost``: the lease was lost (expired, taken over, force-released) while ``fn`` ran.
    ``fence``: with ``fencing=True``, the grant's fencing token (strictly increasing
    per key); else None.
    ``permit``: with ``limit`` of 2 or more, which of the key's permits the call
    held (from 0); else None.
    ``rerun``: with ``on_locked="rerun"``, not acquired: this call marked the key,
    and its holder runs once more when its run ends.
    """

    acquired: bool
    result: T | None = None
    lost: bool = False
    fence: int | None = None
    permit: int | None = None
    rerun: bool = False


class TaskLockService:
    """Runs work under a lease lock held in the configured storage.

    With no ``backend`` the one named by ``TASKLOCK_BACKEND`` is used, looked
    up at each call, so changing settings (``override_settings``) takes
    effect. A service is safe to share between threads.
    """

    def __init__(self, backend: BaseBackend | None = None) -> None:
        self._backend = backend

    @property
    def backend(self) -> BaseBackend:
        return self._backend if self._backend is not None else get_backend()

    def peek(self, key: str) -> HeldLock | None:
        """Who holds ``key`` and until when (by the storage's clock), or None if nobody.

        A ``limit=N`` key is held by its permits, each a lease of its own: its
        own name answers None; ``backend.list()`` shows the permits (their
        keys are ``permit_key(key, n)``).
        """
        return self.backend.peek(validate_key(key))

    def lock(self, key: str, **options: Unpack[LockKwargs]) -> Lock:
        """A :class:`~django_tasklock.locking.lock.Lock` on ``key``, not yet acquired.

        ``with service.lock("rollups", ttl=600, wait=30) as lock:`` holds the
        key for the block (``async with`` too), raising ``LockNotAcquired``
        if another holder keeps it for ``wait``. Options as for
        :meth:`run_exclusive`, validated now.
        """
        return Lock(key, backend=self._backend, **options)

    def run_exclusive(
        self,
        key: str,
        fn: Callable[[], T],
        *,
        on_locked: Callable[[], object] | Literal["rerun"] | None = None,
        **options: Unpack[LockKwargs],
    ) -> LockResult[T]:
        """Run ``fn()`` if, and only if, nobody else holds ``key``.

        Args:
            key: the caller's key (1 to 245 characters), stored as ``"task-lock:" + key``.
            fn: a zero-argument callable; its return value becomes ``result``.
            on_locked: zero-argument callable called when the key is held elsewhere;
                or ``"rerun"``: mark the key, so that its holder runs its work once
                more when its run ends (``LockResult.rerun``; see docs/rerun.md).
            ttl: seconds or timedelta the lease lasts unless refreshed (default 15 min).
            refresh_interval: how often the heartbeat extends the lease while ``fn``
                runs (default ``ttl / 3``; must be less than ``ttl``).
            max_lifetime: after this long (default and most 24 h) the lease is no
                longer extended, so a runaway ``fn`` cannot hold the key forever.
            wait: keep trying this long while the key is held (default: not at all).
            min_hold: when ``fn`` ends sooner, the key stays held until acquisition
                + ``min_hold`` (at most ``max_lifetime``), kept by the storage.
            fencing: give the grant a fencing token (``LockResult.fence``).
            limit: let up to this many callers hold ``key`` at once (default 1, at
                most 100), each one of its permits (``LockResult.permit``); every caller
                of the key must give the same (else ``LimitMismatch``). Needs a backend
                with ``capabilities.permits`` (every shipped one), else
                ``NotImplementedError`` before anything is written.
            progress_timeout: extend the lease only while ``fn`` calls
                ``current_lock().progress()`` within this long (default: no such condition).
            name: what telemetry calls this lock (``tasklock.name``), e.g. ``"invoice"``
                for keys ``"invoice:<pk>"``; without it, none (never the key).
            cancel_on_loss: ``arun_exclusive`` only; here a ``TypeError``, before
                anything is written (sync code stops at ``raise_if_lost()``).

        While ``fn`` runs, ``django_tasklock.current_lock()`` is its lock. When
        the key is held, one INFO line on the ``django_tasklock`` logger names
        the key and its holder (host, pid, acquired at, expires at), and
        ``lock_skipped`` is sent, before ``on_locked`` is called.

        The lease is released whether ``fn`` returns or raises (any
        ``BaseException``, which then propagates unchanged). If the storage
        cannot be reached while acquiring, its error is raised: it is never
        reported as ``acquired=False``. A failed release is logged and leaves
        the lease to expire; it never replaces ``fn``'s outcome. When ``fn`` ran
        inside the caller's ``transaction.atomic()``, the lease is released when
        that transaction commits or rolls back, so the next holder sees its work.

        Raises:
            TypeError, ValueError: bad arguments, naming the parameter; nothing is written
                (a coroutine function for ``fn`` or ``on_locked`` names ``arun_exclusive``;
                so does a plain function that returns a coroutine, which is closed, after
                the lock is released).
            SyncLockInAsyncContext: called inside async code (a running event loop in
                this thread), where it would block the loop; nothing is written.
            ImproperlyConfigured: ``TASKLOCK_DEFAULTS`` is invalid.
        """
        lock = self.lock(key, **options)  # the key and every option, validated once
        validate_sync_callable("fn", fn, twin="arun_exclusive")
        if wants_rerun(on_locked):
            check_rerun(lock)
            refuse_event_loop(lock.key, "run_exclusive()", "await arun_exclusive()")
            return self._run_marked(lock, fn)
        on_locked = cast("Callable[[], object] | None", on_locked)
        validate_sync_callable("on_locked", on_locked, twin="arun_exclusive", optional=True)
        refuse_event_loop(lock.key, "run_exclusive()", "await arun_exclusive()")
        acquired, result = False, None
        try:
            acquired = lock.try_acquire()
            if acquired:
                context = loss.enter(lock, stop=False)
                try:
                    result = fn()
                finally:
                    loss.leave(context)
                refuse_coroutine("fn", result, advice=_ASYNC_ADVICE)
        finally:
            # lock.held, not try_acquire's answer: interrupted just after the
            # grant, before that answer was stored, the lease is still released.
            if lock.held:
                lock.release()
        if not acquired:
            report_skipped(lock, _name(fn))
            if on_locked is not None:
                refuse_coroutine("on_locked", on_locked(), advice=_ASYNC_ADVICE)
            return LockResult(acquired=False)
        return LockResult(
            acquired=True, result=result, lost=lock.lost, fence=lock.fence, permit=lock.permit
        )

    @staticmethod
    def _run_marked(lock: Lock, fn: Callable[[], T]) -> LockResult[T]:
        """``run_exclusive`` with ``on_locked="rerun"`` (see ``api.rerun``)."""
        name = _name(fn)
        try:
            outcome = take_or_mark(lock, name)
        except BaseException:
            if lock.held:  # interrupted between the grant and its answer
                lock.release()
            raise
        if outcome != ACQUIRED:
            return LockResult(acquired=False, rerun=outcome == RERUN)

        def work() -> T:
            context = loss.enter(lock, stop=False)
            try:
                result = fn()
            finally:
                loss.leave(context)
            refuse_coroutine("fn", result, advice=_ASYNC_ADVICE)
            return result

        result = run_marked(lock, work, name)
        return LockResult(
            acquired=True, result=result, lost=lock.lost, fence=lock.fence, permit=lock.permit
        )

    async def arun_exclusive(
        self,
        key: str,
        async_fn: Callable[[], Awaitable[T]],
        *,
        on_locked: Callable[[], object] | Literal["rerun"] | None = None,
        **options: Unpack[LockKwargs],
    ) -> LockResult[T]:
        """The asyncio twin of :meth:`run_exclusive`: ``await async_fn()`` under the lock.

        Storage calls run in a worker thread and waiting is ``asyncio.sleep``,
        so nothing blocks the event loop. Cancelling the awaiting task
        releases the lock and the ``CancelledError`` propagates. ``on_locked``
        may be a plain or an ``async`` function.

        With ``cancel_on_loss=True`` the task running ``async_fn`` is cancelled
        at the declaration of a loss (at its next ``await``), and this raises
        :class:`~django_tasklock.LockLost` instead of that ``CancelledError``;
        a cancellation from outside still propagates as ``CancelledError``.
        """
        lock = self.lock(key, **options)  # the key and every option, validated once
        validate_callable("async_fn", async_fn)
        if wants_rerun(on_locked):
            check_rerun(lock)
            return await self._arun_marked(lock, async_fn)
        on_locked = cast("Callable[[], object] | None", on_locked)
        validate_callable("on_locked", on_locked, optional=True)
        acquired, result = False, None
        try:
            async with lock:  # cancel_on_loss, current_lock(): as for any `async with`
                acquired = True
                result = await awaited("async_fn", async_fn(), twin="run_exclusive")
        except LockNotAcquired:
            if acquired:  # async_fn's own, about another lock
                raise
        finally:
            if lock.held:  # interrupted between the grant and the block
                await lock.arelease()
        if not acquired:
            await off_loop(report_skipped)(lock, _name(async_fn))
            if on_locked is not None:
                outcome = on_locked()
                if inspect.isawaitable(outcome):
                    await outcome
            return LockResult(acquired=False)
        return LockResult(
            acquired=True, result=result, lost=lock.lost, fence=lock.fence, permit=lock.permit
        )

    @staticmethod
    async def _arun_marked(lock: Lock, async_fn: Callable[[], Awaitable[T]]) -> LockResult[T]:
        """``arun_exclusive`` with ``on_locked="rerun"`` (see ``api.rerun``)."""
        name = _name(async_fn)
        try:
            outcome = await atake_or_mark(lock, name)
        except BaseException:
            if lock.held:  # interrupted between the grant and its answer
                await lock.arelease()
            raise
        if outcome != ACQUIRED:
            return LockResult(acquired=False, rerun=outcome == RERUN)

        async def work() -> T:  # current_lock(), cancel_on_loss: as for any `async with`
            return await as_body(
                lock, lambda: awaited("async_fn", async_fn(), twin="run_exclusive")
            )

        result = await arun_marked(lock, work, name)
        return LockResult(
            acquired=True, result=result, lost=lock.lost, fence=lock.fence, permit=lock.permit
        )


def _name(fn: object) -> str:
    """How the log names the work: ``module.qualname`` of a function, else its repr."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(fn)


_default_service = TaskLockService()


def lock(key: str, **options: Unpack[LockKwargs]) -> Lock:
    """:meth:`TaskLockService.lock` on the service of ``TASKLOCK_BACKEND``."""
    return _default_service.lock(key, **options)


def run_exclusive(
    key: str,
    fn: Callable[[], T],
    *,
    on_locked: Callable[[], object] | Literal["rerun"] | None = None,
    **options: Unpack[LockKwargs],
) -> LockResult[T]:
    """:meth:`TaskLockService.run_exclusive` on the service of ``TASKLOCK_BACKEND``."""
    return _default_service.run_exclusive(key, fn, on_locked=on_locked, **options)


async def arun_exclusive(
    key: str,
    async_fn: Callable[[], Awaitable[T]],
    *,
    on_locked: Callable[[], object] | Literal["rerun"] | None = None,
    **options: Unpack[LockKwargs],
) -> LockResult[T]:
    """:meth:`TaskLockService.arun_exclusive` on the service of ``TASKLOCK_BACKEND``."""
    return await _default_service.arun_exclusive(key, async_fn, on_locked=on_locked, **options)
