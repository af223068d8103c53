"""The async methods of :class:`~django_tasklock.lock.Lock`: ``aacquire``,
``atry_acquire``, ``arelease`` and ``async with``.

Each runs the lock's own synchronous steps off the event loop (``aio.off_loop``,
one thread at a time); only the pauses between looks at a held key are
``asyncio.sleep``. A caller cancelled while an attempt is under way leaves the
attempt to finish in its thread, and what it took is released (see
:class:`Attempt`); a release, once started, completes even if its caller is
cancelled.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
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


class Attempt:
    """One attempt run off the loop, and whether its caller still awaits it.

    The caller, cancelled, gives the attempt up; the attempt, granted the key,
    makes the grant the lock's (``held``). Both take one mutex, so exactly one
    side sees to the release. Given up first, the attempt deletes its row
    itself, in its thread: that needs no event loop, which may be closing
    (``asyncio.run`` returning) while the attempt still waits for the storage.
    Made the lock's first, the lock is held when the caller's
    ``CancelledError`` is raised, and the caller's side releases it.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.given_up = False
        self._owned = False

    def give_up(self) -> bool:
        """The caller was cancelled: True if the grant is the lock's already (release it)."""
        with self._mutex:
            self.given_up = True
            return self._owned

    def own(self, hold: Callable[[], None]) -> bool:
        """In the attempt's thread, granted: ``hold()`` unless given up; False if given up."""
        with self._mutex:
            if self.given_up:
                return False
            hold()
            self._owned = True
            return True


class AsyncLockMethods(loss.ActsOnLoss):
    """The async methods :class:`~django_tasklock.lock.Lock` inherits, with acting on a loss."""

    wait: timedelta
    fence: int | None
    #: The async attempt under way in this lock's thread (None: a sync acquisition).
    _attempt: Attempt | None = None

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
            attempt = Attempt()
            # Kept (aio.keep): it finishes, and is waited for, whatever becomes of us.
            running = keep(off_loop(self._attempt_once)(backend, look_first, attempt))
            try:
                acquired, seconds_left = await asyncio.shield(running)
            except asyncio.CancelledError:
                if attempt.give_up():  # granted as the cancellation landed
                    keep(self._undo(running, self._lease))
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

    def _attempt_once(
        self, backend: BaseBackend, look_first: bool, attempt: Attempt
    ) -> tuple[bool, float | None]:
        """``_try_once`` in the lock's thread, for ``attempt`` (see :class:`Attempt`)."""
        if attempt.given_up:
            return False, None  # its caller was cancelled before it began: nothing asked
        self._attempt = attempt
        try:
            return self._try_once(backend, look_first)
        finally:
            self._attempt = None

    def _own(self, lease: Lease, fence: int | None) -> bool:
        """Make a grant this lock's (``held``); False if its async caller gave the attempt up."""
        attempt = self._attempt
        if attempt is None:
            self._hold(lease, fence)
            return True
        return attempt.own(lambda: self._hold(lease, fence))

    def _hold(self, lease: Lease, fence: int | None) -> None:
        self._lease, self._held, self.fence = lease, True, fence

    async def _undo(
        self, attempt: asyncio.Future[tuple[bool, float | None]], lease: Lease | None
    ) -> None:
        """Release the grant an attempt made the lock's as its caller was cancelled.

        The caller's own clean-up (``if lock.held: await lock.arelease()``)
        sees the grant too: whichever comes second finds the lease released
        and does nothing.
        """
        await asyncio.wait([attempt])  # its end (heartbeat, signal), not its outcome
        await off_loop(self._release_if_held)(lease)

    def _release_if_held(self, lease: Lease | None) -> None:
        # Run where every step of this lock runs (``off_loop``: one thread at a
        # time), so the check and the release are never interleaved with
        # another release; ``lease`` is the grant the abandoned attempt made the lock's.
        if self._held and self._lease is lease:
            self.release()
