"""The locks' health: a lease held too long, or a heartbeat falling behind.

What one process can see, and so what is judged here:

- **Its own heartbeat** (:func:`heartbeat_findings`): the tick under way has
  run, or a tick that ended less than two refresh intervals ago took, longer
  than the refresh interval of the leases it refreshes (``ticks``; the
  slowest is reported). A process that holds no lock has nothing to show.
- **What the storage shows of every holder** (:func:`lease_findings`): each
  listed lease, against the first ``TASKLOCK_HEALTH`` entry whose pattern
  matches its key. Held longer than the entry's ``max_held`` (by the storage's
  clock, :func:`~django_tasklock.display.seconds_held`, the "held for" that
  ``manage.py tasklock list`` and the admin page show). Or not refreshed on
  time: the storage keeps a lease's expiry, not its ttl, so the entry says
  which ttl and refresh interval its leases use (by default those a lock
  uses, ``TASKLOCK_DEFAULTS`` then the built-in ones); the last refresh was
  ``ttl - seconds_left`` ago, and more than two refresh intervals means the
  refresh due one interval after it is at least an interval late: its
  holder's heartbeat, in whatever process, is behind. A lease whose expiry
  reached acquisition + ``max_lifetime`` is no longer extended, and is not
  judged so.

``manage.py check --deploy`` (``checks.check_lock_health``) and the
django-health-check plugin (``contrib.health_check``) report these.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_tasklock import display
from django_tasklock.backends.base import HeldLock
from django_tasklock.conf import conf
from django_tasklock.durations import to_timedelta
from django_tasklock.lease import clock
from django_tasklock.options import LockOptions
from django_tasklock.ticks import recent_ticks

SETTING = "TASKLOCK_HEALTH"
FIELDS = ("max_held", "ttl", "refresh_interval", "max_lifetime")

HELD_TOO_LONG = "held_too_long"
REFRESH_OVERDUE = "refresh_overdue"
HEARTBEAT_BEHIND = "heartbeat_behind"

# "*", or a template's field ("{account}"), matches any run of characters.
_WILDCARD = re.compile(r"\{[^{}]*\}|\*")
# Storage clocks and millisecond expiries: how near acquisition + max_lifetime
# an expiry must be to count as capped there.
_CAPPED_WITHIN = timedelta(seconds=1)


@dataclasses.dataclass(frozen=True)
class Limit:
    """One ``TASKLOCK_HEALTH`` entry, validated."""

    pattern: str
    max_held: timedelta | None
    options: LockOptions  #: the ttl, refresh interval and max_lifetime its leases use

    def matches(self, key: str) -> bool:
        return _regex(self.pattern).fullmatch(key) is not None


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing wrong: what, how long (``seconds``) against what limit (``limit``)."""

    kind: str  #: HELD_TOO_LONG, REFRESH_OVERDUE or HEARTBEAT_BEHIND
    seconds: float  #: held for; since the last refresh; the tick's duration
    limit: float  #: max_held; the refresh interval (twice it is overdue); the refresh interval
    key: str | None = None  #: the lease's key (None for HEARTBEAT_BEHIND)
    pattern: str | None = None  #: the TASKLOCK_HEALTH entry that judged the lease
    under_way: bool = False  #: HEARTBEAT_BEHIND: the tick has not ended

    def describe(self, *, key: bool = True) -> str:
        """A sentence; ``key=False`` names the entry's pattern instead of the key."""
        held, limit = display.duration(self.seconds), display.duration(self.limit)
        if self.kind == HEARTBEAT_BEHIND:
            tick = "its latest tick has run for" if self.under_way else "a recent tick took"
            return (
                f"This process's heartbeat is behind: {tick} {held}, "
                f"longer than the refresh interval ({limit})."
            )
        which = repr(self.key) if key else f"A lock matching {self.pattern!r}"
        if self.kind == HELD_TOO_LONG:
            return (
                f"{which} has been held for {held}, longer than the {limit} that "
                f"{SETTING}[{self.pattern!r}] allows."
            )
        return (
            f"{which} was last refreshed {held} ago, more than twice its refresh "
            f"interval ({limit}): its holder's heartbeat is behind."
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
        )
    except (TypeError, ValueError) as exc:
        message = str(exc) if str(exc).startswith(name) else f"{name}: {exc}"
        raise ImproperlyConfigured(message) from exc


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
    """This process's heartbeat, if a recent tick is slower than its refresh interval:
    one finding, the slowest such tick (the quick ticks that follow it, of its backend
    or another, do not hide it)."""
    now = clock()
    behind = [tick for tick in recent_ticks() if tick.behind(now)]
    if not behind:
        return []
    tick = max(behind, key=lambda tick: tick.seconds(now))
    return [
        Finding(
            HEARTBEAT_BEHIND,
            seconds=tick.seconds(now),
            limit=tick.refresh_interval,
            under_way=tick.ended is None,
        )
    ]


def lease_findings(locks: list[HeldLock], entries: list[Limit]) -> list[Finding]:
    """The leases of ``locks`` held too long or not refreshed on time, by ``entries``."""
    found: list[Finding] = []
    for lock in locks:
        entry = next((entry for entry in entries if entry.matches(lock.key)), None)
        if entry is None:
            continue
        held = display.seconds_held(lock)
        if entry.max_held is not None and held > entry.max_held.total_seconds():
            limit = entry.max_held.total_seconds()
            found.append(Finding(HELD_TOO_LONG, held, limit, lock.key, entry.pattern))
        options = entry.options
        capped_at = display.utc(lock.acquired_at) + options.max_lifetime - _CAPPED_WITHIN
        if display.utc(lock.expires_at) >= capped_at:
            continue
        interval = options.refresh_interval.total_seconds()
        since_refresh = options.ttl.total_seconds() - lock.seconds_left
        if since_refresh > 2 * interval:
            found.append(
                Finding(REFRESH_OVERDUE, since_refresh, interval, lock.key, entry.pattern)
            )
    return found
