"""The heartbeat's latest tick, as this process saw it: for health checks.

A tick is one ``refresh_many`` call of the heartbeat for one backend (see
``heartbeat``). The heartbeat notes when each starts and ends; :func:`last_tick`
reads the latest, finished or under way. Only this process's heartbeat is
seen here: another process's is judged from what the storage shows (see
``health``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django_tasklock.lease import clock

if TYPE_CHECKING:
    from django_tasklock.lease import Lease


@dataclasses.dataclass(frozen=True)
class Tick:
    """One tick: when it started and ended (:func:`~django_tasklock.lease.clock` seconds)."""

    started: float
    #: the shortest refresh interval among the leases it refreshes, in seconds
    refresh_interval: float
    leases: int  #: how many leases it was given
    ended: float | None = None  #: None while it is under way

    def seconds(self, now: float | None = None) -> float:
        """How long it took; while under way, how long it has run so far."""
        end = self.ended if self.ended is not None else clock() if now is None else now
        return max(0.0, end - self.started)

    def behind(self, now: float | None = None) -> bool:
        """True when it took (or, under way, has run) longer than its refresh interval.

        A finished tick counts for two refresh intervals after it ended: by
        then the heartbeat, if it still held leases, would have started the next.
        """
        if self.seconds(now) <= self.refresh_interval:
            return False
        if self.ended is None:
            return True
        now = clock() if now is None else now
        return now - self.ended < 2 * self.refresh_interval


_last: Tick | None = None


def last_tick() -> Tick | None:
    """This process's latest heartbeat tick (under way or finished); None before the first."""
    return _last


def tick_started(leases: Sequence[Lease]) -> Tick:
    """Note a tick starting on ``leases`` (called by the heartbeat's thread)."""
    global _last
    interval = min(lease.options.refresh_interval.total_seconds() for lease in leases)
    _last = Tick(started=clock(), refresh_interval=interval, leases=len(leases))
    return _last


def tick_ended(tick: Tick) -> None:
    """Note the end of ``tick`` (called by the heartbeat's thread)."""
    global _last
    _last = dataclasses.replace(tick, ended=clock())


def _forget() -> None:
    # A forked child has no heartbeat thread: the parent's tick under way
    # would look stalled there forever.
    global _last
    _last = None


os.register_at_fork(after_in_child=_forget)
