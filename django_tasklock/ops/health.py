"""The locks' health: a lease held too long or by a process gone, or a heartbeat behind.

What one process can see, and so what is judged here:

- **Its own heartbeat** (:func:`heartbeat_findings`): its refreshes of a
  storage failing (a storage it cannot reach: every failure comes fast, so no
  tick looks slow), until one is answered there again or the leases that
  failed have run out by their ttl. And the tick under way has
  run, or a tick that ended less than two refresh intervals ago took, longer
  than the refresh interval of the leases it refreshes (``ticks``; the
  slowest is reported). A process that holds no lock has nothing to show.
- **What the storage shows of every holder** (:func:`lease_findings`): each
  listed lease, against the first ``TASKLOCK_HEALTH`` entry whose pattern
  matches its key. Held longer than the entry's ``max_held`` (by the storage's
  clock, :func:`~django_tasklock.ops.display.seconds_held`, the "held for" that
  ``manage.py tasklock list`` and the admin page show). Or not refreshed on
  time: the storage keeps a lease's expiry, not its ttl, so the entry says
  which ttl and refresh interval its leases use (by default those a lock
  uses, ``TASKLOCK_DEFAULTS`` then the built-in ones); the last refresh was
  ``ttl - seconds_left`` ago, and more than two refresh intervals means the
  refresh due one interval after it is at least an interval late: its
  holder's heartbeat, in whatever process, is behind. A lease whose expiry
  reached acquisition + ``max_lifetime`` is no longer extended, and is not
  judged so; nor is a ``unique_on`` claim never refreshed since its enqueue
  (its task waits in the queue: no worker has taken it over to refresh it).
  And, whatever the entries say, a lease whose holder process is gone
  (``display.gone``: this process runs on the holder's machine and can tell):
  the next acquisition there takes it over, and a heartbeat there reaps it;
  seen from here, nothing of that machine has yet.

A permit of a ``limit=N`` key is a lease of its own, judged by the entry
its key (the caller's, not the permit's stored name) matches; each finding
names the permit (``permit``). :func:`merged` makes one finding of those of
one kind about a key's permits, for reports that count keys.

``manage.py check --deploy`` (``checks.check_lock_health``) and the
django-health-check plugin (``contrib.health_check``, merged) report these.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_tasklock.backends.base import HeldLock
from django_tasklock.conf import conf
from django_tasklock.durations import to_timedelta
from django_tasklock.leases.lease import clock
from django_tasklock.leases.ticks import recent_ticks, unreachable
from django_tasklock.locking.options import LockOptions
from django_tasklock.ops import display

SETTING = "TASKLOCK_HEALTH"
FIELDS = ("max_held", "ttl", "refresh_interval", "max_lifetime")

HELD_TOO_LONG = "held_too_long"
REFRESH_OVERDUE = "refresh_overdue"
HEARTBEAT_BEHIND = "heartbeat_behind"
STORAGE_UNREACHABLE = "storage_unreachable"
#: The entry's ttl is longer than the lease's: its refreshes cannot be judged by it.
TTL_NOT_THE_LOCKS = "ttl_not_the_locks"
HOLDER_GONE = "holder_gone"

# "*", or a template's field ("{account}"), matches any run of characters.
_WILDCARD = re.compile(r"\{[^{}]*\}|\*")
# Storage clocks and millisecond expiries: how near acquisition + max_lifetime
# an expiry must be to count as capped there.
_CAPPED_WITHIN = timedelta(seconds=1)
# How near acquisition + ttl an expiry must be to count as never refreshed: a
# refresh moves it later by the time since the enqueue; Redis reads in whole ms.
_UNREFRESHED_WITHIN = timedelta(milliseconds=100)
# How far "refreshed before its acquisition" may go, by the entry's ttl, before it
# says the entry's ttl is not the lock's: the storage's reading of two times.
_TTL_SLACK = timedelta(seconds=1)


@dataclasses.dataclass(frozen=True)
class Limit:
    """One ``TASKLOCK_HEALTH`` entry, validated."""

    pattern: str
    max_held: timedelta | None
    options: LockOptions  #: the ttl, refresh interval and max_lifetime its leases use
    #: The entry gives its locks' ttl (else the default is assumed, see :func:`lease_findings`).
    ttl_given: bool = True

    def matches(self, key: str) -> bool:
        return _regex(self.pattern).fullmatch(key) is not None


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing wrong: what, how long (``seconds``) against what limit (``limit``)."""

    #: HELD_TOO_LONG, REFRESH_OVERDUE, TTL_NOT_THE_LOCKS, HEARTBEAT_BEHIND,
    #: STORAGE_UNREACHABLE or HOLDER_GONE
    kind: str
    #: held for; since the last refresh (by the entry's ttl); the tick's duration;
    #: since the first failed refresh. TTL_NOT_THE_LOCKS, HOLDER_GONE: held for
    seconds: float
    #: max_held; the refresh interval (twice it is overdue); the refresh interval;
    #: STORAGE_UNREACHABLE: since the latest failed refresh; TTL_NOT_THE_LOCKS: the entry's ttl
    limit: float
    key: str | None = None  #: the lease's key (None for this process's heartbeat)
    pattern: str | None = None  #: the TASKLOCK_HEALTH entry that judged the lease
    under_way: bool = False  #: HEARTBEAT_BEHIND: the tick has not ended
    error: str | None = None  #: STORAGE_UNREACHABLE: the latest error's type name
    #: REFRESH_OVERDUE, TTL_NOT_THE_LOCKS: what the storage showed: the lease's time left
    left: float | None = None
    #: REFRESH_OVERDUE: the entry's ttl, from which the last refresh was counted back
    ttl: float | None = None
    #: REFRESH_OVERDUE: the entry gives no ttl: the default was assumed
    ttl_assumed: bool = False
    holder: str | None = None  #: HOLDER_GONE: the holder's host and pid
    #: The lease is this permit of ``key`` (a ``limit=N`` key); None for a mutex's lease
    permit: int | None = None
    #: :func:`merged`: the permits of ``key`` found so (this finding is the worst of them)
    permits: tuple[int, ...] = ()

    def _which(self, key: bool, worst: str) -> str:
        """The sentence's subject: the lease (or, merged, the worst of the permits) found."""
        if self.permits:
            numbers = ", ".join(str(n) for n in self.permits)
            if key:
                return f"Of permits {numbers} of {self.key!r}, the {worst}"
            return (
                f"Of {len(self.permits)} permits of a lock matching {self.pattern!r}, the {worst}"
            )
        if key:
            return display.named(self.key or "", self.permit)
        if self.permit is not None:
            return f"A permit of a lock matching {self.pattern!r}"
        return f"A lock matching {self.pattern!r}"

    def describe(self, *, key: bool = True) -> str:
        """A sentence; ``key=False`` names the entry's pattern instead of the key."""
        held, limit = display.duration(self.seconds), display.duration(self.limit)
        if self.kind == STORAGE_UNREACHABLE:
            return (
                f"This process's heartbeat cannot reach the lock storage: its refreshes "
                f"have failed for {held} (the latest {display.duration(self.limit)} ago, "
                f"{self.error}); the leases they keep alive there run out at their ttl."
            )
        if self.kind == HEARTBEAT_BEHIND:
            tick = "its latest tick has run for" if self.under_way else "a recent tick took"
            return (
                f"This process's heartbeat is behind: {tick} {held}, "
                f"longer than the refresh interval ({limit})."
            )
        if self.kind == HOLDER_GONE:
            if key:
                which = display.named(self.key or "", self.permit)
            else:
                which = "A lock" if self.permit is None else "A permit of a lock"
            return (
                f"{which} is held by {self.holder}, whose process is gone "
                f"(held for {held}); it is taken over by the next acquisition on that "
                "machine, or reaped there by the heartbeat of a process holding a lock."
            )
        entry = f"{SETTING}[{self.pattern!r}]"
        if self.kind == HELD_TOO_LONG:
            which = self._which(key, "longest held")
            return (
                f"{which} has been held for {held}, longer than the {limit} that {entry} allows."
            )
        left = display.duration(self.left or 0.0)
        if self.kind == TTL_NOT_THE_LOCKS:
            which = self._which(key, "longest held")
            return (
                f"{which} has {left} of its lease left after being held for {held}: its "
                f"ttl is shorter than the {limit} that {entry} gives, so its refreshes "
                "cannot be judged by that entry."
            )
        ttl = display.duration(self.ttl or 0.0)
        if self.ttl_assumed:
            gives = f"the default ttl, which {entry} assumes for want of one"
        else:
            gives = f"the ttl that {entry} gives"
        which = self._which(key, "least recently refreshed")
        return (
            f"{which} has {left} of its lease left; with {gives} "
            f"({ttl}), it was last refreshed {held} ago, more than twice its refresh "
            f"interval ({limit}): its holder's heartbeat is behind, or its lock uses "
            "another ttl than the entry."
        )


def limits(value: Any = None) -> list[Limit]:
    """``TASKLOCK_HEALTH`` (or ``value``) validated; ``ImproperlyConfigured`` naming it.

    A dict of key patterns to either ``max_held`` (seconds or a timedelta) or a
    dict of ``max_held``, ``ttl``, ``refresh_interval``, ``max_lifetime`` (each
    optional; the last three as a lock takes them). In order: a key is judged
    by the first pattern it matches. Empty when the setting is absent.
    """
    value = conf.HEALTH if value is None else value
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(
            f"{SETTING} must be a dict of key patterns to limits, not {type(value).__name__}"
        )
    return [_limit(pattern, entry) for pattern, entry in value.items()]


def _limit(pattern: object, entry: object) -> Limit:
    if not isinstance(pattern, str) or not pattern:
        raise ImproperlyConfigured(
            f"{SETTING} has the key {pattern!r}: each key must be a key pattern, a "
            "non-empty string"
        )
    name = f"{SETTING}[{pattern!r}]"
    fields: Mapping[Any, Any]
    if isinstance(entry, Mapping):
        fields, max_held_name = entry, f"{name}['max_held']"
    else:
        fields, max_held_name = {"max_held": entry}, name
    unknown = sorted(set(fields) - set(FIELDS), key=repr)
    if unknown:
        raise ImproperlyConfigured(f"{name} has unknown keys {unknown}; allowed: {FIELDS}")
    try:
        max_held = fields.get("max_held")
        return Limit(
            pattern=pattern,
            max_held=None if max_held is None else to_timedelta(max_held_name, max_held),
            options=LockOptions.resolve(
                ttl=fields.get("ttl"),
                refresh_interval=fields.get("refresh_interval"),
                max_lifetime=fields.get("max_lifetime"),
            ),
            ttl_given=fields.get("ttl") is not None,
        )
    except (TypeError, ValueError) as exc:
        message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
        raise ImproperlyConfigured(message) from exc


def _never_refreshed(lock: HeldLock, ttl: timedelta) -> bool:
    """Whether the lease still ends ``ttl`` after its acquisition: never refreshed since."""
    ends = display.utc(lock.acquired_at) + ttl + _UNREFRESHED_WITHIN
    return display.utc(lock.expires_at) <= ends


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    parts: list[str] = []
    end = 0
    for wildcard in _WILDCARD.finditer(pattern):
        parts.append(re.escape(pattern[end : wildcard.start()]))
        parts.append(".*" if wildcard.group() == "*" else ".+")
        end = wildcard.end()
    parts.append(re.escape(pattern[end:]))
    return re.compile("".join(parts), re.DOTALL)


def heartbeat_findings() -> list[Finding]:
    """This process's heartbeat: a storage it cannot reach, and a recent tick slower
    than its refresh interval.

    At most one finding of each: the storage whose refreshes have failed
    longest (until one is answered again there, or the leases that failed have
    run out), and the slowest such tick (the quick ticks that follow it, of its
    backend or another, do not hide it).
    """
    now = clock()
    found: list[Finding] = []
    failing = unreachable()
    if failing:
        first = min(failing, key=lambda noted: noted.since)
        found.append(
            Finding(
                STORAGE_UNREACHABLE,
                seconds=now - first.since,
                limit=now - first.last,
                error=first.error,
            )
        )
    behind = [tick for tick in recent_ticks() if tick.behind(now)]
    if behind:
        tick = max(behind, key=lambda tick: tick.seconds(now))
        found.append(
            Finding(
                HEARTBEAT_BEHIND,
                seconds=tick.seconds(now),
                limit=tick.refresh_interval,
                under_way=tick.ended is None,
            )
        )
    return found


def lease_findings(locks: list[HeldLock], entries: list[Limit]) -> list[Finding]:
    """The leases of ``locks`` held too long or not refreshed on time, by ``entries``.

    A permit of a ``limit=N`` key is judged by the entry its key matches (the
    caller's key, never the permit's stored name), as a lease of its own: each
    finding names its permit. :func:`merged` makes one of a key's permits
    found so.
    """
    found: list[Finding] = []
    for lock in locks:
        key = display.key(lock)
        entry = next((entry for entry in entries if entry.matches(key)), None)
        found += [
            dataclasses.replace(finding, key=key, permit=display.permit(lock))
            for finding in _judged(lock, entry)
        ]
    return found


def merged(found: list[Finding]) -> list[Finding]:
    """``found`` with the findings of one kind about several permits of one key made one.

    A ``limit=N`` key whose 3 permits are all held too long is one key held
    too long, not 3 locks: the finding of the worst (the longest held, or
    longest since its refresh) stands for them, its ``permits`` saying
    which. Findings of a process gone stay one per permit (each names its
    holder), and so do a mutex's. In the order of the first finding of each.
    """
    groups: dict[tuple[str, str | None, str | None] | int, list[Finding]] = {}
    for index, finding in enumerate(found):
        if finding.permit is None or finding.kind == HOLDER_GONE:
            groups[index] = [finding]  # a group of its own
        else:
            groups.setdefault((finding.kind, finding.key, finding.pattern), []).append(finding)
    result = []
    for group in groups.values():
        if len(group) == 1:
            result.append(group[0])
            continue
        worst = max(group, key=lambda finding: finding.seconds)
        numbers = tuple(sorted(finding.permit for finding in group if finding.permit is not None))
        result.append(dataclasses.replace(worst, permit=None, permits=numbers))
    return result


def _judged(lock: HeldLock, entry: Limit | None) -> list[Finding]:
    """What is wrong with one lease, by ``entry`` (None: no entry matches its key)."""
    found: list[Finding] = []
    held = display.seconds_held(lock)
    if display.gone(lock):
        pattern = None if entry is None else entry.pattern
        who = display.holder(lock.holder)
        found.append(Finding(HOLDER_GONE, held, 0.0, lock.key, pattern, holder=who))
        return found
    if entry is None:
        return found
    if entry.max_held is not None and held > entry.max_held.total_seconds():
        limit = entry.max_held.total_seconds()
        found.append(Finding(HELD_TOO_LONG, held, limit, lock.key, entry.pattern))
    options = entry.options
    capped_at = display.utc(lock.acquired_at) + options.max_lifetime - _CAPPED_WITHIN
    if display.utc(lock.expires_at) >= capped_at:
        return found
    if lock.holder.claim and _never_refreshed(lock, options.ttl):
        return found  # a task waiting in its queue: nobody refreshes it before it runs
    interval, ttl = options.refresh_interval.total_seconds(), options.ttl.total_seconds()
    since_refresh = ttl - lock.seconds_left
    if since_refresh > held + _TTL_SLACK.total_seconds():
        # Refreshed before it was acquired, by the entry's ttl: not the lock's ttl.
        # An entry that gives none (only max_held) assumed the default: not judged.
        if entry.ttl_given:
            found.append(
                Finding(
                    TTL_NOT_THE_LOCKS,
                    held,
                    ttl,
                    lock.key,
                    entry.pattern,
                    left=lock.seconds_left,
                )
            )
    elif since_refresh > 2 * interval:
        found.append(
            Finding(
                REFRESH_OVERDUE,
                since_refresh,
                interval,
                lock.key,
                entry.pattern,
                left=lock.seconds_left,
                ttl=ttl,
                ttl_assumed=not entry.ttl_given,
            )
        )
    return found
