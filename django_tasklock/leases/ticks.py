"""The heartbeat's recent ticks, as this process saw them: for health checks.

A tick is one ``refresh_many`` call of the heartbeat for one backend (see
``heartbeat``). The heartbeat notes when each starts and ends; :func:`last_tick`
reads the latest, finished or under way, and :func:`recent_ticks` those that
may still be behind. Only this process's heartbeat is seen here: another
process's is judged from what the storage shows (see ``health``).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django_tasklock import forks
from django_tasklock.leases.lease import clock

if TYPE_CHECKING:
    from django_tasklock.leases.lease import Lease


@dataclasses.dataclass(frozen=True)
class Tick:
    """One tick's start and end, as :func:`~django_tasklock.leases.lease.clock` reads them."""

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


@dataclasses.dataclass(frozen=True)
class Unreachable:
    """The heartbeat's refreshes of one storage failing, since ``since``."""

    since: float  #: when the first failure in a row was noted (``clock()``)
    last: float  #: when the latest was
    error: str  #: the latest error's type name (never its text: it may name hosts)
    #: how long after ``last`` it is still reported: the longest ttl of the leases
    #: that failed, by when each has run out in the storage too
    keep: float

    def reported(self, now: float) -> bool:
        """Whether a lease that failed may still live at ``now``."""
        return now - self.last <= self.keep


_options_of = operator.attrgetter("options")

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
    """Note a tick starting on ``leases`` (on the heartbeat's thread): one backend's refreshes,
    or the look for dead holders that every lease waits behind."""
    global _last, _recent
    now = clock()
    terms = list(map(_options_of, leases))
    first = terms[0]
    if all(map(operator.is_, terms, itertools.repeat(first))):  # the usual: all share one
        interval = first.refresh_interval.total_seconds()
    else:
        distinct = dict(zip(map(id, terms), terms, strict=True))
        interval = min(options.refresh_interval.total_seconds() for options in distinct.values())
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


#: Per backend (its ``id``), its refreshes failing; replaced whole, never changed in place.
_unreachable: dict[int, Unreachable] = {}


def refresh_failed(backend: object, leases: Sequence[Lease], error: BaseException) -> None:
    """Note that refreshing ``leases`` on ``backend`` failed (on the heartbeat's thread)."""
    global _unreachable
    now = clock()
    keep = max(lease.options.ttl.total_seconds() for lease in leases)
    earlier = _unreachable.get(id(backend))
    since = earlier.since if earlier is not None else now
    if earlier is not None:
        keep = max(keep, earlier.keep - (now - earlier.last))
    noted = Unreachable(since=since, last=now, error=type(error).__name__, keep=keep)
    kept = {k: v for k, v in _unreachable.items() if v.reported(now)}  # none piles up
    _unreachable = {**kept, id(backend): noted}


def refresh_answered(backend: object) -> None:
    """Note that ``backend`` answered a refresh: its failures, if any, are over."""
    global _unreachable
    if id(backend) in _unreachable:
        _unreachable = {k: v for k, v in _unreachable.items() if k != id(backend)}


def unreachable() -> list[Unreachable]:
    """The storages whose latest refreshes failed, while a lease they failed may live on.

    Kept until a refresh there is answered again, or until the longest ttl of
    the leases that failed has passed since the latest failure (those leases
    have run out by then, and the heartbeat no longer calls that storage).
    """
    now = clock()
    return [noted for noted in _unreachable.values() if noted.reported(now)]


def _over(tick: Tick, now: float) -> bool:
    """Whether ``tick`` can no longer be behind (finished quick, or long enough ago)."""
    return tick.ended is not None and not tick.behind(now)


def _forget() -> None:
    # A forked child has no heartbeat thread: the parent's tick under way
    # would look stalled there forever.
    global _last, _recent, _unreachable
    _last = None
    _recent = ()
    _unreachable = {}


forks.on_fork(_forget)
