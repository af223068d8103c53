"""The async methods of :class:`~django_tasklock.lock.Lock`: ``aacquire``,
``atry_acquire``, ``arelease`` and ``async with``.

Each runs the lock's own synchronous steps off the event loop (``aio.off_loop``,
one thread at a time); only the pauses between looks at a held key are
``asyncio.sleep``. A caller cancelled while an attempt is under way leaves the
attempt to finish in its thread, and what it took is released; a release,
once started, completes even if its caller is cancelled.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from django_tasklock import loss, observe
from django_tasklock.aio import keep, off_loop
from django_tasklock.exceptions import LockLost, LockNotAcquired
from django_tasklock.waiting import Backoff

if TYPE_CHECKING:
    from datetime import timedelta
    from types import TracebackType

    from typing_extensions import Self

    from django_tasklock.backends.base import BaseBackend
    from django_tasklock.lease import Lease
    from django_tasklock.lock import Lock
    from django_tasklock.observe import Acquisition


class AsyncLockMethods(loss.ActsOnLoss):
    """The async methods :class:`~django_tasklock.lock.Lock` inherits, with acting on a loss."""

    wait: timedelta

    if TYPE_CHECKING:  # the synchronous steps, defined by Lock

        def _ready(self) -> BaseBackend: ...

        def _try_once(
            self, backend: BaseBackend, look_first: bool
        ) -> tuple[bool, float | None]: ...

        def release(self) -> None: ...

    async def aacquire(self) -> Self:
        """:meth:`acquire` without blocking the event loop."""
        self._no_cancel_on_loss()
        if not await self._atry_acquire():
            raise LockNotAcquired(self.key, self.wait or None)
        return self

    async def atry_acquire(self) -> bool:
        """:meth:`try_acquire` without blocking the event loop.

        Cancelling the awaiting task while an attempt is under way lets the
        attempt finish in its thread and releases what it took.
        """
        self._no_cancel_on_loss()
        return await self._atry_acquire()

    async def _atry_acquire(self) -> bool:
        backend = self._ready()
        if observe.observer is None:
            return await self._atake(backend, None)
        with observe.observer.acquiring(cast("Lock", self), backend) as seen:
            return seen.granted(await self._atake(backend, seen))

    async def _atake(self, backend: BaseBackend, seen: Acquisition | None) -> bool:
        backoff = Backoff(self.wait)
        look_first = False
        while True:
            attempt = asyncio.ensure_future(off_loop(self._try_once)(backend, look_first))
            try:
                acquired, seconds_left = await asyncio.shield(attempt)
            except asyncio.CancelledError:
                attempt.add_done_callback(self._undo)
                raise
            if acquired:
                return True
            pause = backoff.next_pause(seconds_left)
            if pause is None:
                return False
            if seen is not None and not look_first:
                seen.waiting()
            await asyncio.sleep(pause)
            look_first = True

    async def arelease(self) -> None:
        """:meth:`release` off the event loop; it completes even if the caller is cancelled.

        Queued behind a release of the same grant that has not started yet (one
        whose caller was cancelled), this one does nothing; once that release
        has begun, the lock is no longer held and this raises ``RuntimeError``.
        """
        if self._lease is None or not self._held:
            raise RuntimeError(f"task lock {self.key!r} is not held")
        await asyncio.shield(keep(off_loop(self._release_if_held)(self._lease)))

    async def __aenter__(self) -> Self:
        if not await self._atry_acquire():
            raise LockNotAcquired(self.key, self.wait or None)
        self.enter_body()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stopped = self.leave_body(exc)
        await self.arelease()
        lease = self._lease
        found_by_release = self.cancel_on_loss and lease is not None and lease.lost
        if stopped is None and exc is None and found_by_release:
            # Only the release found the loss: the result was made without the lock.
            assert lease is not None
            stopped = LockLost(self.key, lease.reason)
        if stopped is not None:
            raise stopped from exc

    def _undo(self, attempt: asyncio.Future[tuple[bool, float | None]]) -> None:
        """Release what an attempt abandoned by a cancelled caller acquired.

        A cancellation that lands as the attempt finishes lets the caller's
        own clean-up (``if lock.held: await lock.arelease()``) see the grant
        too: whichever comes second finds the lease released and does nothing.
        """
        if attempt.cancelled() or attempt.exception() is not None:
            return
        if attempt.result()[0]:
            keep(off_loop(self._release_if_held)(self._lease))

    def _release_if_held(self, lease: Lease | None) -> None:
        # Run where every step of this lock runs (``off_loop``: one thread at a
        # time), so the check and the release are never interleaved with
        # another release; ``lease`` is the grant the abandoned attempt made.
        if self._held and self._lease is lease:
            self.release()
