"""Judging a refresh still under way by the leases' local deadlines.

The heartbeat refreshes leases with one call that may not answer for a
while: a Redis paused by ``CLIENT PAUSE``, a row lock the database makes the
refresh wait for, a network that drops packets. Until the call answers, or
fails at its socket or statement timeout, the heartbeat's own thread cannot
look at anything. Meanwhile each lease is known to be live only until its
``valid_until`` (the last confirmed refresh plus ``ttl``): past it, the
storage may have let it expire and another worker may hold the key.

So a second daemon thread watches the leases of the call under way and, as
each one's ``valid_until`` passes before the call answers, declares it:
lost (warning, ``lock_lost``, ``lost``), or, where ``valid_until`` was the
lease's ``max_lifetime`` deadline, at its cap (the usual warning). It costs
one lock and one notification per refresh call, not per lease, and sleeps
while nothing is under way.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django_tasklock.lease import NOT_CONFIRMED, clock

if TYPE_CHECKING:
    from django_tasklock.lease import Lease

logger = logging.getLogger("django_tasklock")


class Watchdog:
    """Declares leases whose refresh is still under way past their ``valid_until``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._leases: Sequence[Lease] = ()
        self._until = math.inf  # the earliest valid_until among self._leases
        self._thread: threading.Thread | None = None

    def begin(self, leases: Sequence[Lease], until: float) -> None:
        """A refresh of ``leases`` is being sent; ``until``: their earliest ``valid_until``."""
        with self._cond:
            self._leases, self._until = leases, until
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="django-tasklock-watchdog", daemon=True
                )
                self._thread.start()
            else:
                self._cond.notify()

    def end(self) -> None:
        """The refresh answered (or failed): nothing is under way."""
        with self._cond:
            self._leases, self._until = (), math.inf

    def _overdue(self) -> list[Lease]:
        """Wait until some lease under way is past its ``valid_until``; return those."""
        with self._cond:
            while True:
                now = clock()
                if self._until > now:
                    self._cond.wait(None if self._until == math.inf else self._until - now)
                    continue
                overdue = [lease for lease in self._leases if lease.valid_until < now]
                rest = [lease for lease in self._leases if lease.valid_until >= now]
                self._leases = rest
                self._until = min((lease.valid_until for lease in rest), default=math.inf)
                return overdue

    def _run(self) -> None:
        while True:
            for lease in self._overdue():
                if lease.closed:
                    continue
                try:
                    if lease.valid_until >= lease.deadline:
                        lease.reach_max_lifetime()
                    else:
                        lease.report_lost(NOT_CONFIRMED)
                except BaseException:  # the thread must go on watching the others
                    logger.exception("The django-tasklock watchdog failed on %r.", lease.key)
