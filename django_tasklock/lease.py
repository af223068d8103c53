"""A lease this process holds: its token, timing and whether it was lost.

The heartbeat keeps leases alive; the lock hands one to the caller. The lease
itself knows neither: it is the record both share. Its local deadlines are
read off :func:`clock`, which keeps counting while the machine is suspended
(``CLOCK_BOOTTIME`` on Linux): after a resume, a lease whose ttl passed
during the sleep is known to be lost, not "retried".
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from django_tasklock.signals import lock_lost, lock_stalled

if TYPE_CHECKING:
    from datetime import timedelta

    from django.dispatch import Signal

    from django_tasklock.backends.base import BaseBackend, Holder
    from django_tasklock.options import LockOptions

logger = logging.getLogger("django_tasklock")


def new_token() -> str:
    """An unguessable token that also names this host and process: ``host:pid:secret``."""
    return (_token_prefix or _name_this_process()) + secrets.token_urlsafe(18)


_token_prefix = ""  # "host:pid:", made on first use and again in a forked child


def _name_this_process() -> str:
    global _token_prefix
    _token_prefix = f"{socket.gethostname()}:{os.getpid()}:"
    return _token_prefix


def _forget_process_name() -> None:
    global _token_prefix
    _token_prefix = ""


os.register_at_fork(after_in_child=_forget_process_name)


#: Why a lease is lost when no refresh confirmed it in time (failed, or still under way).
NOT_CONFIRMED = "no refresh succeeded before the lease could have run out"

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


class PendingRelease(Protocol):
    """A release waiting for the caller's transactions to end."""

    def settle(self) -> bool:
        """Release the lease if they have all ended; True once it is released."""


class Lease:
    """One lock held by this process: what the heartbeat keeps alive, what the caller reads."""

    def __init__(
        self,
        backend: BaseBackend,
        key: str,
        token: str,
        holder: Holder,
        options: LockOptions,
        *,
        asked_at: float,
        progress_timeout: timedelta | None = None,
    ) -> None:
        """``asked_at``: :func:`clock` just before the acquisition was sent.

        The storage dated the lease after that instant, so every local time
        derived from it (the deadline, when the lease is surely valid until)
        errs on the early side. ``progress_timeout``: see :meth:`stalled`.
        """
        self.backend = backend
        self.key = key
        self.token = token
        self.holder = holder
        self.options = options
        self.pid = os.getpid()
        self.deadline = asked_at + options.max_lifetime.total_seconds()
        self.next_due = asked_at + options.refresh_interval.total_seconds()
        #: Until when the lease is known to be live, by the last confirmation.
        self.valid_until = asked_at + min(options.ttl, options.max_lifetime).total_seconds()
        #: What the refresh under way confirms if it succeeds (set by the heartbeat).
        self.confirmed_until = self.valid_until
        self.closed = False
        #: Set while the release waits for the caller's transaction to end.
        self.pending: PendingRelease | None = None
        self._lost = False
        #: Why the lease was lost (``"expired"``, ``"taken"``, ...), once it was.
        self.reason: str | None = None
        #: Set at the declaration of the loss: for code that waits on it.
        self.lost_event = threading.Event()
        self._loss_callbacks: list[Callable[[Lease], None]] = []
        self._capped = False  # the max_lifetime warning was logged
        #: When the work last said it moves (``Lock.progress()``); the acquisition at first.
        self.progress_at = asked_at
        self.progress_timeout = (
            None if progress_timeout is None else progress_timeout.total_seconds()
        )
        self._stalled = False
        self._lost_lock = threading.Lock()

    @property
    def lost(self) -> bool:
        """True once the lease was found gone or someone else's, or no refresh
        confirmed it before it could have run out (it may then still be held)."""
        return self._lost

    def report_lost(self, when: str) -> None:
        """Record the loss once: a warning, the ``lock_lost`` signal, ``lost`` set."""
        if self.mark_lost():
            self.announce_loss(when)

    def mark_lost(self, reason: str | None = None) -> bool:
        """Set ``lost`` (and ``reason``, ``lost_event``); True the first time only.

        The first time, the callbacks given to :meth:`on_loss` run here, on the
        declaring thread, before this returns; the caller then announces it.
        """
        with self._lost_lock:
            if self._lost:
                return False
            self.reason = reason
            self._lost = True
            callbacks = list(self._loss_callbacks)
        self.lost_event.set()
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                logger.exception("A loss callback of task lock %r failed.", self.key)
        return True

    def on_loss(self, callback: Callable[[Lease], None]) -> None:
        """Call ``callback(lease)`` at the declaration of the loss (at once if already lost).

        It runs on the thread that declares the loss (the heartbeat's or the
        deadline watcher's): it must be quick and never block, e.g.
        ``loop.call_soon_threadsafe(task.cancel)``.
        """
        with self._lost_lock:
            if not self._lost:
                self._loss_callbacks.append(callback)
                return
        callback(self)

    def announce_loss(self, when: str) -> None:
        """The warning and the ``lock_lost`` signal for a loss just marked."""
        logger.warning(
            "Task lock %r was lost (%s): it expired, was taken over or was force-released "
            "while %s held it.",
            self.key,
            when,
            self.holder,
        )
        self.announce(lock_lost)

    @property
    def capped(self) -> bool:
        """True once the lease reached ``max_lifetime`` (the warning is logged then)."""
        return self._capped

    def reach_max_lifetime(self) -> None:
        """Warn, once, that the lease reached ``max_lifetime`` and is no longer refreshed."""
        with self._lost_lock:
            if self._capped:
                return
            self._capped = True
        logger.warning(
            "Task lock %r reached its max_lifetime of %s: no longer refreshed, the "
            "lease will expire while the work may still be running.",
            self.key,
            self.options.max_lifetime,
        )

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
        logger.warning(
            "Task lock %r: no progress for %.1f s (progress_timeout): no longer refreshed, "
            "the lease will run out while %s holds it.",
            self.key,
            now - self.progress_at,
            self.holder,
        )
        self.announce(lock_stalled)
        return True

    def wake_at(self) -> float:
        """When the heartbeat should next look at this lease."""
        if self.pending is None:
            return self.next_due
        return min(self.next_due, clock() + WATCH_INTERVAL)

    def announce(self, signal: Signal) -> None:
        """Send ``signal`` about this lease; a failing receiver is logged, never raised.

        The lock must not depend on receivers: an exception here would skip a
        release, or end the heartbeat thread and with it every lease's refresh.
        ``send_robust`` already logs each failure with its traceback (logger
        ``django.dispatch``), so this adds one line naming the key, without
        a second copy of the traceback.
        """
        for receiver, outcome in signal.send_robust(
            sender=type(self.backend), key=self.key, holder=self.holder
        ):
            if isinstance(outcome, Exception):
                logger.error(
                    "A receiver of a django-tasklock signal about %r failed: %r raised %r "
                    "(traceback on the django.dispatch logger).",
                    self.key,
                    receiver,
                    outcome,
                )
