"""Acting on a lost lease: checking for it, waiting for it, and finding the lock to check.

A loss is declared on the :class:`~django_tasklock.leases.lease.Lease` by the
heartbeat, the deadline watcher, the release, or whichever thread first reads
``lost`` past the deadline; nothing here talks to the storage.
:class:`ActsOnLoss` gives the :class:`~django_tasklock.locking.lock.Lock`
its ``raise_if_lost()``, ``lost_event``, ``wait_lost()`` and ``progress()``;
:func:`current` (``current_lock()``) and :func:`checkpoint` let code reach the lock it runs
under without being handed it (``@exclusive`` functions, ``run_exclusive``'s
``fn``). The asyncio side, cancelling a body at the declaration, is
``aio.LossCanceller``.
"""

from __future__ import annotations

import asyncio
import threading
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, NamedTuple

from django_tasklock.exceptions import LockLost
from django_tasklock.leases.lease import clock
from django_tasklock.locking.aio import LossCanceller

if TYPE_CHECKING:
    from django_tasklock.leases.lease import Lease


class ActsOnLoss:
    """What a :class:`~django_tasklock.locking.lock.Lock` offers the work to act on a loss.

    Each reads the lease of the current (or, after release, the last)
    acquisition; none makes a storage call.
    """

    key: str
    cancel_on_loss: bool
    _lease: Lease | None
    _held: bool
    _context: Token[Holding | None] | None
    _canceller: LossCanceller | None

    def raise_if_lost(self) -> None:
        """Raise :class:`~django_tasklock.LockLost` if the lease was lost; else nothing.

        Cheap enough for every turn of a tight loop: one attribute read, no
        storage call, no lock taken. ``LockLost.reason`` says why. Before the
        first acquisition it does nothing (there is nothing to lose yet).
        """
        lease = self._lease
        if lease is not None and lease.lost:
            raise LockLost(self.key, lease.reason)

    @property
    def lost_event(self) -> threading.Event:
        """A ``threading.Event`` set at the declaration of the loss, for code that waits.

        Belongs to one acquisition: acquired again, the lock has a new one.
        Raises ``RuntimeError`` before the first acquisition.
        """
        lease = self._lease
        if lease is None:
            raise RuntimeError(f"task lock {self.key!r} was never acquired")
        return lease.lost_event

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the loss is declared or ``timeout`` seconds pass; True if lost.

        ``lost_event.wait(timeout)``: for code that polls other things
        (a queue, a socket) with a timeout of its own.
        """
        return self.lost_event.wait(timeout)

    def progress(self) -> None:
        """Tell the heartbeat the work is moving; with ``progress_timeout``, it must.

        With ``progress_timeout=`` the heartbeat extends the lease only while
        the last call to this was within that timeout; without, it changes
        nothing. One clock read, no storage call. Raises ``RuntimeError`` if
        the lock is not held.
        """
        lease = self._lease
        if lease is None or not self._held:
            raise RuntimeError(f"task lock {self.key!r} is not held")
        lease.progress_at = clock()

    def enter_body(self) -> None:
        """The acquiring task's body begins: make this lock current, arm ``cancel_on_loss``."""
        self._context = enter(self, stop=self.cancel_on_loss)
        task = asyncio.current_task()
        if self.cancel_on_loss and task is not None and self._lease is not None:
            self._canceller = LossCanceller(self._lease, task)

    def leave_body(self, error: BaseException | None) -> LockLost | None:
        """The body ended (with ``error``): the ``LockLost`` to raise if the loss stopped it.

        With ``cancel_on_loss``, also when the body returned after the
        declaration without reaching another ``await`` (it blocked the event
        loop, so the cancellation never landed): its result was made partly
        without the lock, as the sync ``@exclusive(on_lost="raise")`` says at return.
        """
        leave(self._context)
        canceller, self._context, self._canceller = self._canceller, None, None
        if canceller is None:
            return None
        lease = self._lease
        stopped = canceller.settle(error)
        if not stopped and error is None and lease is not None and lease.lost:
            stopped = True
        if not stopped:
            return None
        return LockLost(self.key, lease.reason if lease is not None else None)

    def _no_cancel_on_loss(self) -> None:
        if self.cancel_on_loss:
            raise TypeError(
                f"cancel_on_loss=True cancels an asyncio task: use it with `async with` or "
                f"arun_exclusive(), not here (task lock {self.key!r}); sync code stops at "
                f"lock.raise_if_lost()"
            )


class Holding(NamedTuple):
    lock: ActsOnLoss
    stop: bool  # checkpoint() raises once the lease is lost


_current: ContextVar[Holding | None] = ContextVar("django_tasklock_current", default=None)


def current() -> ActsOnLoss | None:
    """The lock the running code holds (see :func:`~django_tasklock.locking.lock.current_lock`)."""
    holding = _current.get()
    return holding.lock if holding is not None else None


def checkpoint() -> None:
    """A point where work may be stopped for a lost lease: raises ``LockLost`` or returns.

    It raises when the innermost lock around this call was lost and its
    owner asked for the work to stop: ``@exclusive(on_lost="raise")``,
    ``async with lock(..., cancel_on_loss=True)`` or
    ``arun_exclusive(..., cancel_on_loss=True)``. Otherwise (no lock, the
    default ``on_lost="continue"``, a plain ``with lock``) it does nothing, so
    code shared by locked and unlocked callers may call it freely. No
    storage call.
    """
    holding = _current.get()
    if holding is not None and holding.stop:
        holding.lock.raise_if_lost()


def enter(lock: ActsOnLoss, *, stop: bool) -> Token[Holding | None]:
    """Make ``lock`` the current one; ``stop``: :func:`checkpoint` raises on its loss."""
    return _current.set(Holding(lock, stop))


def leave(token: Token[Holding | None] | None) -> None:
    """Undo :func:`enter` (nothing if ``token`` is None or of another context)."""
    if token is None:
        return
    try:  # noqa: SIM105 - contextlib.suppress would add three calls to every lock
        _current.reset(token)
    except ValueError:  # left in another context: nothing to undo here
        pass
