"""A lease this process holds: its token, timing and whether it was lost.

The heartbeat keeps leases alive; the lock hands one to the caller. The lease
itself knows neither: it is the record both share. Its local deadlines are
read off :func:`clock`, which keeps counting while the machine is suspended
(``CLOCK_BOOTTIME`` on Linux): after a resume, a lease whose ttl passed
during the sleep is known to be lost, not "retried". What a lease tells the
project (its signals, the warning at a loss) is sent by :func:`announce` and
:func:`announce_loss`, at the end of this module.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from django_tasklock import notifier
from django_tasklock.backends.base import limited_key
from django_tasklock.leases.tokens import new_token as new_token
from django_tasklock.leases.tokens import this_pid
from django_tasklock.reasons import EXPIRED, MAX_LIFETIME, RELEASED_BY_OPERATOR, TAKEN
from django_tasklock.signals import lock_lost, lock_stalled

if TYPE_CHECKING:
    from datetime import timedelta

    from django.dispatch import Signal

    from django_tasklock.backends.base import BaseBackend, Holder


logger = logging.getLogger("django_tasklock")

#: Seconds between two looks at a lease waiting for its caller's transaction.
WATCH_INTERVAL = 0.5

if hasattr(time, "CLOCK_BOOTTIME"):

    def clock() -> float:
        """Seconds on a clock that also counts time spent suspended (Linux)."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)

else:  # pragma: no cover - not Linux: monotonic is the best there is

    def clock() -> float:
        """Seconds on the monotonic clock."""
        return time.monotonic()


class Terms(Protocol):
    """The timing a lease is granted with: a lock's validated options (``LockOptions``)."""

    @property
    def ttl(self) -> timedelta: ...

    @property
    def refresh_interval(self) -> timedelta: ...

    @property
    def max_lifetime(self) -> timedelta: ...


class PendingRelease(Protocol):
    """A release waiting for the caller's transactions to end."""

    def settle(self) -> bool:
        """Release the lease if they have all ended; True once it is released."""


class Lease:
    """One lock held by this process: what the heartbeat keeps alive, what the caller reads.

    **Lost, by the clock.** A lease is lost at its local deadline,
    :attr:`valid_until`: when its last confirmed refresh (or its acquisition)
    was *sent*, plus ``ttl``; or acquisition + ``max_lifetime``, whichever comes
    first. Past that instant the storage may have let it go, so :attr:`lost`
    says True, whoever looks and whatever the heartbeat is doing; the
    declaration (``reason``, ``lost_event``, the :meth:`on_loss` callbacks,
    then the warning and ``lock_lost``) happens once, on the first thread to
    notice: the deadline watcher, the heartbeat, or the caller reading ``lost``.
    A refresh or release that finds the lease gone or someone else's
    declares it at once, before any deadline.
    """

    def __init__(
        self,
        backend: BaseBackend,
        key: str,
        token: str,
        holder: Holder,
        options: Terms,
        *,
        asked_at: float,
        progress_timeout: timedelta | None = None,
    ) -> None:
        """``asked_at``: :func:`clock` just before the acquisition was sent.

        The storage dated the lease after that instant, so every local time
        derived from it errs on the early side; an acquisition answered after
        its ``ttl`` gives a lease born past its deadline, lost at once.
        ``progress_timeout``: see :meth:`stalled`.
        """
        self.backend = backend
        #: The caller's key: what signals, logs and telemetry name.
        self.key = key
        #: What the storage knows the lease by, in every call made for it
        #: (refresh, release, peek, fence): the key itself, or for one of a
        #: ``limit=N`` key's permits, the permit's name (``permit_key``). Set by
        #: the grant, before the lease is shared with the heartbeat.
        self.stored_as = key
        self.token = token
        self.holder = holder
        self.options = options
        self.pid = this_pid()
        #: :func:`clock` just before the granted acquisition was sent: where the
        #: hold starts, by this side's clock (the storage dated the grant after it).
        self.asked_at = asked_at
        #: Acquisition + ``max_lifetime``: no refresh is sent after it.
        self.deadline = asked_at + options.max_lifetime.total_seconds()
        self.next_due = asked_at + options.refresh_interval.total_seconds()
        #: The local deadline: until when the lease is known to be live, by the
        #: last confirmation. Only ever moves later.
        self.valid_until = asked_at + min(options.ttl, options.max_lifetime).total_seconds()
        #: What the refresh under way confirms if it succeeds (set by the heartbeat).
        self.confirmed_until = self.valid_until
        #: :func:`clock` when the storage last said the lease is ours (acquisition, refresh).
        self.answered_at = asked_at
        #: Set when the lease leaves the heartbeat (released); ``lost`` is then final.
        self.closed = False
        #: Where its lock object was acquired (file, line, function), once that object
        #: was garbage-collected unreleased: the heartbeat then stops refreshing it.
        self.dropped: tuple[str, int, str] | None = None
        #: Set while the release waits for the caller's transaction to end.
        self.pending: PendingRelease | None = None
        self._lost = False
        #: Why the lease was lost (see ``django_tasklock.reasons``), once it was.
        self.reason: str | None = None
        #: :func:`clock` at the declaration of the loss.
        self.declared_at: float | None = None
        self._lost_event: threading.Event | None = None  # made on first use (lost_event)
        self._loss_callbacks: list[Callable[[Lease], None]] = []
        #: When the work last said it moves (``Lock.progress()``); the acquisition at first.
        self.progress_at = asked_at
        self.progress_timeout = (
            None if progress_timeout is None else progress_timeout.total_seconds()
        )
        self._stalled = False
        self._lost_lock = threading.Lock()

    @property
    def permit(self) -> int | None:
        """Which of a ``limit=N`` key's permits this is (from 0), or None for a mutex's lease."""
        return None if self.stored_as == self.key else limited_key(self.stored_as)[1]

    def cap(self, deadline: float) -> None:
        """Bring :attr:`deadline` (the ``max_lifetime`` one) forward to ``deadline``, if earlier.

        For a lease whose cap the storage counts from an earlier acquisition
        than this side's (a ``unique_on`` claim, taken over by the worker long
        after the enqueue took it). Called before the lease is granted, so
        that :attr:`valid_until` never says more than the storage will keep.
        """
        if deadline < self.deadline:
            self.deadline = deadline
            self.valid_until = min(self.valid_until, deadline)
            self.confirmed_until = min(self.confirmed_until, deadline)

    def storage_stepped(self, seconds: float) -> None:
        """The storage's clock stepped forward ``seconds``: it ends this lease that much sooner.

        Its local deadline and its ``max_lifetime`` cap (:attr:`deadline`)
        come ``seconds`` earlier; past them, it is lost at the next look
        (see ``storage_clock``). Only the heartbeat's thread calls this.
        """
        self.deadline -= seconds
        self.valid_until -= seconds
        self.confirmed_until -= seconds

    @property
    def lost_event(self) -> threading.Event:
        """Set at the declaration of the loss: for code that waits on it.

        Made on first use (most leases are never waited on), already set if
        the loss was declared before.
        """
        event = self._lost_event
        if event is None:
            with self._lost_lock:
                if self._lost_event is None:
                    self._lost_event = threading.Event()
                    if self._lost:
                        self._lost_event.set()
                event = self._lost_event
        return event

    @property
    def declared(self) -> bool:
        """Whether the loss was declared; unlike ``lost``, no look at the clock."""
        return self._lost

    @property
    def lost(self) -> bool:
        """True from the local deadline on (or once found gone or someone else's).

        Compares the clock with :attr:`valid_until` itself, so the first look
        after a pause (``SIGSTOP``, a long GC) already says True. Once the
        lease is released (``closed``), the answer no longer changes.
        """
        if self._lost:
            return True
        if self.closed or clock() < self.valid_until:
            return False
        self.expire()
        return True

    def expire(self, *, inline: bool = False) -> None:
        """Declare the loss at the local deadline (a no-op if already declared).

        The warning and ``lock_lost`` go to the notifier thread, unless
        ``inline`` (on the caller's thread, when it releases the lease): a
        look at ``lost`` never runs receivers.
        """
        # ``lost`` turns True before the announcement is queued: the process's
        # exit, which a job that sees it may begin at once, waits for both.
        with notifier.pending():
            if self.mark_lost(MAX_LIFETIME if self.valid_until >= self.deadline else EXPIRED):
                if inline:
                    notifier.run(self.announce_loss)
                else:
                    notifier.notifier().submit(self.announce_loss)

    def declare(self, reason: str) -> None:
        """Declare the loss for ``reason`` (once): then warn and send ``lock_lost``.

        The announcement runs at once on the caller's thread, and on the
        notifier's from the heartbeat or the deadline watcher.
        """
        with notifier.pending():  # as in expire()
            if self.mark_lost(reason):
                notifier.run(self.announce_loss)

    def found_not_ours(self) -> str:
        """The reason, when a refresh or the release found the lease not ours: one look.

        Someone else's lease at the key is ``"taken"``; no lease at all,
        before the local deadline, is ``"released_by_operator"``.
        """
        try:
            held = self.backend.peek(self.stored_as)
        except Exception:
            return TAKEN
        return TAKEN if held is not None else RELEASED_BY_OPERATOR

    def mark_lost(self, reason: str | None = None) -> bool:
        """Set ``lost`` (and ``reason``, ``lost_event``); True the first time only.

        The first time, the callbacks given to :meth:`on_loss` run here, on the
        declaring thread, before this returns; the caller then announces it.
        """
        with self._lost_lock:
            if self._lost:
                return False
            self.reason = reason
            self.declared_at = clock()
            self._lost = True
            callbacks = list(self._loss_callbacks)
            event = self._lost_event
        if event is not None:  # else made already set, if ever asked for
            event.set()
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                notifier.log(
                    logging.ERROR,
                    "A loss callback of task lock %r failed.",
                    self.key,
                    exc_info=True,
                )
        return True

    def on_loss(self, callback: Callable[[Lease], None]) -> None:
        """Call ``callback(lease)`` at the declaration of the loss (at once if already lost).

        It runs on the thread that declares the loss (the deadline watcher's,
        the heartbeat's, or the caller's): it must be quick and never block,
        e.g. ``loop.call_soon_threadsafe(task.cancel)``.
        """
        with self._lost_lock:
            if not self._lost:
                self._loss_callbacks.append(callback)
                return
        callback(self)

    def announce_loss(self) -> None:
        """The warning and the ``lock_lost`` signal (with ``reason``) for a loss just marked."""
        announce_loss(self)

    def stalled(self, now: float) -> bool:
        """Whether the work, given a ``progress_timeout``, went longer than it without progress.

        Asked by the heartbeat before each refresh, which then stops extending
        the lease: it runs out ``ttl`` after its last refresh, though the
        process is alive. The first True logs a warning and sends
        ``lock_stalled``; from then on it stays True (progress made later does
        not revive a lease left to run out).
        """
        if self._stalled or self.progress_timeout is None:
            return self._stalled
        if now - self.progress_at <= self.progress_timeout:
            return False
        self._stalled = True
        # On the notifier thread when asked by the heartbeat: never a handler here.
        notifier.log(
            logging.WARNING,
            "Task lock %r: no progress for %.1f s (progress_timeout): no longer refreshed, "
            "the lease will run out while %s holds it.",
            self.key,
            now - self.progress_at,
            self.holder,
        )
        notifier.run(self.announce, lock_stalled)
        return True

    def wake_at(self) -> float:
        """When the heartbeat should next look at this lease."""
        if self.pending is None:
            return self.next_due
        return min(self.next_due, clock() + WATCH_INTERVAL)

    def announce(self, signal: Signal, **extra: object) -> None:
        """Send ``signal`` about this lease; a failing receiver is logged, never raised
        (see :func:`announce`)."""
        announce(self, signal, **extra)


def announce(lease: Lease, signal: Signal, **extra: object) -> None:
    """Send ``signal`` about ``lease``; a failing receiver is logged, never raised.

    The lock must not depend on receivers: an exception here would skip a
    release, or end a thread the whole process relies on.
    ``send_robust`` already logs each failure with its traceback (logger
    ``django.dispatch``), so this adds one line naming the key, without
    a second copy of the traceback. With no receiver connected (the usual
    case), nothing is built or sent.
    """
    if not signal.receivers:
        return
    for receiver, outcome in signal.send_robust(
        sender=type(lease.backend), key=lease.key, holder=lease.holder, **extra
    ):
        if isinstance(outcome, Exception):
            logger.error(
                "A receiver of a django-tasklock signal about %r failed: %r raised %r "
                "(traceback on the django.dispatch logger).",
                lease.key,
                receiver,
                outcome,
            )


def announce_loss(lease: Lease) -> None:
    """The warning and the ``lock_lost`` signal (with ``reason``) for a loss just marked."""
    logger.warning(
        "Task lock %r was lost (%s): %s, while %s held it.",
        lease.key,
        lease.reason,
        _WHY.get(lease.reason or "", "it was lost"),
        lease.holder,
    )
    announce(lease, lock_lost, reason=lease.reason)


_WHY = {
    EXPIRED: "no refresh was confirmed within its ttl, so it may have expired",
    TAKEN: "another holder has the key",
    RELEASED_BY_OPERATOR: "the key was found free before its deadline (force-released, "
    "or lost by the storage)",
    MAX_LIFETIME: "it reached its max_lifetime and is no longer extended",
}
