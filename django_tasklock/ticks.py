"""The heartbeat's recent ticks, as this process saw them: for health checks.

A tick is one ``refresh_many`` call of the heartbeat for one backend (see
``heartbeat``). The heartbeat notes when each starts and ends; :func:`last_tick`
reads the latest, finished or under way, and :func:`recent_ticks` those that
may still be behind. Only this process's heartbeat is seen here: another
process's is judged from what the storage shows (see ``health``).
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
#: The ticks that may still be behind, replaced whole, never changed in place
#: (other threads read it without a lock).
_recent: tuple[Tick, ...] = ()


def last_tick() -> Tick | None:
    """This process's latest heartbeat tick (under way or finished); None before the first."""
    return _last


def recent_ticks() -> list[Tick]:
    """The ticks that may still be :meth:`~Tick.behind`: the one under way, and each
    finished one that took longer than its refresh interval, until two of its
    intervals after it ended, whatever ticks followed it.

    The tick after a slow one follows at once (its leases are overdue, or those
    of another backend are) and is usually quick: judged by the latest tick
    only, a heartbeat that fell behind would stop looking so the moment the
    slow tick ended.
    """
    now = clock()
    return [tick for tick in _recent if not _over(tick, now)]


def tick_started(leases: Sequence[Lease]) -> Tick:
    """Note a tick starting on ``leases``, all of one backend (on the heartbeat's thread)."""
    global _last, _recent
    now = clock()
    interval = min(lease.options.refresh_interval.total_seconds() for lease in leases)
    _last = Tick(started=now, refresh_interval=interval, leases=len(leases))
    _recent = (*(tick for tick in _recent if not _over(tick, now)), _last)
    return _last


def tick_ended(tick: Tick) -> None:
    """Note the end of ``tick`` (called by the heartbeat's thread)."""
    global _last, _recent
    ended = dataclasses.replace(tick, ended=clock())
    if _last is tick:
        _last = ended
    kept = [old for old in _recent if old is not tick]
    if ended.seconds() > ended.refresh_interval:  # slow: behind for a while yet
        kept.append(ended)
    _recent = tuple(kept)


def _over(tick: Tick, now: float) -> bool:
    """Whether ``tick`` can no longer be behind (finished quick, or long enough ago)."""
    return tick.ended is not None and not tick.behind(now)


def _forget() -> None:
    # A forked child has no heartbeat thread: the parent's tick under way
    # would look stalled there forever.
    global _last, _recent
    _last = None
    _recent = ()


os.register_at_fork(after_in_child=_forget)
