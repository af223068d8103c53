"""Judging leases by their local deadlines while the heartbeat waits for the storage.

The heartbeat's thread sends each tick's refreshes (and the releases of
leases whose caller's transaction ended) as calls that may not answer for a
while: a Redis paused by ``CLIENT PAUSE``, a row lock the database makes the
refresh wait for, a network that drops packets. Until a call answers, or
fails at its socket or statement timeout, that thread cannot look at
anything, and no lease of the process is refreshed. Meanwhile each lease is
known to be live only until its ``valid_until`` (its last confirmed refresh
plus ``ttl``): past it, the storage may have let it expire and another worker
may hold the key.

So a second daemon thread watches while a call is under way: as each open
lease's ``valid_until`` passes before the call answers, it declares it lost
(warning, ``lock_lost``, ``lost``), or, where ``valid_until`` was the lease's
``max_lifetime`` deadline, at its cap (the usual warning). Nothing changes a
``valid_until`` while the heartbeat waits, and the heartbeat ends the watch
before it reads an answer, so a lease is declared on the value it had.

A declared loss is what the holder was last able to know, not proof: if the
late answer says the lease is still ours, nobody held the key meanwhile, and
the heartbeat goes on refreshing it (``lost`` stays True), which keeps other
workers out for as long as work that does not check ``lost`` runs.

It costs the heartbeat two short locks and a notification per call. Only a
call that lasts over :data:`MIN_GAP` makes the watchdog's thread copy the list
of leases (under the heartbeat's lock) and look for the earliest deadline, and
again at each deadline, each second, or when a lease is added meanwhile.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from django_tasklock.lease import NOT_CONFIRMED, clock

if TYPE_CHECKING:
    from django_tasklock.lease import Lease

logger = logging.getLogger("django_tasklock")

#: Seconds between two looks at the leases while a call is under way, at most...
RELOOK = 1.0
#: ...and at least: a burst of deadlines is declared together.
MIN_GAP = 0.05


class Watchdog:
    """Declares leases whose ``valid_until`` passes while the heartbeat's call is under way."""

    def __init__(self, leases: Callable[[], list[Lease]]) -> None:
        """``leases``: every lease the heartbeat keeps, queued or being refreshed."""
        self._leases = leases
        self._cond = threading.Condition()
        self._call = 0  # counts calls begun; the one under way, while _busy
        self._busy = False
        self._look_again = False  # a lease was added during the call
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """Whether the heartbeat is waiting for the storage (read without the lock)."""
        return self._busy

    def added(self) -> None:
        """A lease was added while the heartbeat waits: watch it too."""
        with self._cond:
            if self._busy:
                self._look_again = True
                self._cond.notify()

    def begin(self) -> None:
        """The heartbeat is about to wait for the storage."""
        with self._cond:
            self._call += 1
            self._busy = True
            self._look_again = False  # the call's snapshot will have every lease
            if self._thread is not None and self._thread.is_alive():
                self._cond.notify()
                return
            thread = threading.Thread(
                target=self._run, name="django-tasklock-watchdog", daemon=True
            )
            try:
                thread.start()
            except RuntimeError:  # no threads left: refreshing matters more than watching
                logger.warning("The django-tasklock watchdog could not start.", exc_info=True)
            else:
                self._thread = thread

    def end(self) -> None:
        """The call answered (or failed); from now on the heartbeat judges its leases."""
        with self._cond:
            self._busy = False

    def _run(self) -> None:
        watched_call = 0
        while True:
            watched_call = self._next_call(watched_call)
            try:
                self._watch(watched_call)
            except BaseException:  # the thread must go on watching the next call
                logger.exception("The django-tasklock watchdog failed.")

    def _next_call(self, after: int) -> int:
        with self._cond:
            while not (self._busy and self._call != after):
                self._cond.wait()
            return self._call

    def _still_under_way(self, call: int, until: float, not_before: float = 0.0) -> bool:
        """Wait until ``until`` (or a lease added, from ``not_before``) unless ``call``
        ends first; whether it is still under way."""
        with self._cond:
            while self._busy and self._call == call:
                now = clock()
                if now >= until or (self._look_again and now >= not_before):
                    self._look_again = False
                    return True
                self._cond.wait((not_before if self._look_again else until) - now)
            return False

    def _watch(self, call: int) -> None:
        """Declare leases as their deadlines pass, for as long as ``call`` is under way.

        The leases are looked at again at each deadline, when one is added,
        and at least every :data:`RELOOK` seconds; never more often than every
        :data:`MIN_GAP` seconds, and not before the call has lasted that long:
        most calls answer sooner, and then no lease is looked at at all.
        """
        if not self._still_under_way(call, clock() + MIN_GAP):
            return  # the usual case: the call answered in time
        while True:
            watched = [
                lease
                for lease in self._leases()
                if not (lease.closed or lease.lost or lease.capped)
            ]
            earliest = min((lease.valid_until for lease in watched), default=math.inf)
            now = clock()
            until = max(now + MIN_GAP, min(earliest, now + RELOOK))
            if not self._still_under_way(call, until, not_before=now + MIN_GAP):
                return
            capped: list[Lease] = []
            lost: list[Lease] = []
            with self._cond:
                if not (self._busy and self._call == call):
                    return
                # Marked while the call is surely under way: the heartbeat
                # reads the answer only after end(), which waits for this lock.
                now = clock()
                for lease in watched:
                    if lease.closed or lease.valid_until > now:
                        continue
                    if lease.valid_until >= lease.deadline:
                        capped.append(lease)
                    elif lease.mark_lost():
                        lost.append(lease)
            for lease in capped:
                lease.reach_max_lifetime()
            for lease in lost:
                try:
                    lease.announce_loss(NOT_CONFIRMED)
                except BaseException:  # even SystemExit from a receiver: announce the others
                    logger.exception("Announcing the loss of %r failed.", lease.key)
