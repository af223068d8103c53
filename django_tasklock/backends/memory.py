"""Leases in this process's memory, for users' unit tests and single-process tools.

Nothing is shared between processes: two workers each get their own locks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta, timezone

from django_tasklock.backends.base import (
    PERMIT_SEPARATOR,
    RERUN_LIFETIME,
    STALE_AFTER,
    BaseBackend,
    Capabilities,
    HeldLock,
    Holder,
    check_limited_key,
    lease_id,
    limited_key,
    permit_key,
)
from django_tasklock.backends.forksafe import ForkSafeLock
from django_tasklock.exceptions import LimitMismatch
from django_tasklock.processes import holder_gone


@dataclasses.dataclass
class _Lease:
    token: str
    acquired: float  # by the backend's clock, in seconds
    expires: float
    released: bool = False  # cut by a min_hold release: no refresh extends it
    limit: int = 1  # of a permit: the limit it was taken with


@dataclasses.dataclass
class _Mark:
    """A key's "run once more" mark, and the last take of one (for a take sent again)."""

    payload: str | None = None  # None: not marked now
    marked: float = 0.0  # by the backend's clock
    taken_by: str = ""  # the token of the last take by a live holder ...
    taken_number: int = 0  # ... its number ...
    taken: str | None = None  # ... and its answer


class MemoryBackend(BaseBackend):
    """Leases in a dict guarded by one lock; safe across threads, not processes.

    Expiry is judged by ``clock`` (``time.monotonic`` unless a test injects a
    fake one). Reported datetimes are UTC wall-clock times placed relative to
    ``clock``, so a fake clock moves them too. A lease that has expired stays
    in the dict until it is taken over or swept, but every method treats it
    as gone: it cannot be refreshed, released (returns False) or seen.
    """

    capabilities = Capabilities(
        cross_process=False, server_clock=False, dead_holders=True, permits=True, rerun=True
    )

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._leases: dict[str, _Lease] = {}
        self._fences: dict[str, int] = {}  # never swept: fences outlive leases
        # limited key -> the limit its permits were last taken with: where to look
        self._limits: dict[str, int] = {}
        self._marks: dict[str, _Mark] = {}  # key -> its mark, outliving its leases
        self._lock = ForkSafeLock()

    def _live(self, key: str, now: float) -> _Lease | None:
        lease = self._leases.get(key)
        return lease if lease is not None and not self._is_free(lease, now) else None

    @staticmethod
    def _dead(lease: _Lease) -> bool:
        """Whether ``lease``'s holder is provably gone and nothing keeps the key held."""
        return not lease.released and holder_gone(Holder.from_token(lease.token)) is True

    @staticmethod
    def _is_free(lease: _Lease, now: float) -> bool:
        return lease.expires <= now or now - lease.acquired > STALE_AFTER.total_seconds()

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        """Take ``key`` unless a live lease holds it; expired or 24 h old ones are taken over.

        A live lease of ``token`` itself answers True (the acquisition sent again).
        A live lease whose holder is provably gone (``holder_gone``) is taken
        over, unless its release cut it to end at ``min_hold``.

        The first lease lasts ``min(ttl, max_lifetime)``, so even it respects the cap.
        """
        with self._lock:
            now = self._clock()
            permits = self._live_permits(key, now)
            if permits:
                raise LimitMismatch(key, held=permits[0][1].limit, asked=1)
            live = self._live(key, now)
            if live is not None and (live.token == token or not self._dead(live)):
                # Its own lease: sent again; arrived late if its release cut it.
                return live.token == token and not live.released
            lease_seconds = min(ttl, max_lifetime).total_seconds()
            self._leases[key] = _Lease(token=token, acquired=now, expires=now + lease_seconds)
            return True

    def acquire_permit(
        self, key: str, token: str, *, limit: int, ttl: timedelta, max_lifetime: timedelta
    ) -> str | None:
        """The first of ``key``'s ``limit`` permits that is free (or whose holder is gone)."""
        check_limited_key(key, limit)
        with self._lock:
            now = self._clock()
            mutex = self._live(key, now)
            if mutex is not None:
                raise LimitMismatch(key, held=1, asked=limit)
            permits = self._live_permits(key, now)
            for name, lease in permits:
                if lease.limit != limit:
                    raise LimitMismatch(key, held=lease.limit, asked=limit)
                if lease.token == token:  # sent again; arrived late if its release cut it
                    return None if lease.released else name
            self._limits[key] = limit
            for slot in range(limit):
                name = permit_key(key, slot)
                live = self._live(name, now)
                if live is None or self._dead(live):
                    lease_seconds = min(ttl, max_lifetime).total_seconds()
                    self._leases[name] = _Lease(
                        token=token, acquired=now, expires=now + lease_seconds, limit=limit
                    )
                    return name
            return None

    def _live_permits(self, key: str, now: float) -> list[tuple[str, _Lease]]:
        """The live permits of the limited key ``key``, with their names."""
        limit = self._limits.get(key)
        if limit is None:
            return []
        names = (permit_key(key, slot) for slot in range(limit))
        return [(name, lease) for name in names if (lease := self._live(name, now)) is not None]

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        """End the lease at ``min(now + ttl, acquired + max_lifetime)``, never reviving it.

        Past the cap the lease is left to expire, and True is still returned.
        """
        with self._lock:
            now = self._clock()
            lease = self._live(key, now)
            if lease is None or lease.token != token or lease.released:
                return False
            expires = min(now + ttl.total_seconds(), lease.acquired + max_lifetime.total_seconds())
            if expires > now:
                lease.expires = expires
            return True

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        """Delete the lease held by ``token``; False if it expired or another holds it.

        With ``min_hold``, a lease younger than that is cut to end at
        acquisition + ``min_hold`` instead.
        """
        with self._lock:
            now = self._clock()
            lease = self._leases.get(key)
            if lease is None or lease.token != token:
                return False
            live = not self._is_free(lease, now)
            if live and lease.released:
                return True  # the same release, sent again
            if live and min_hold is not None:
                hold_until = lease.acquired + min_hold.total_seconds()
                if hold_until > now:
                    lease.expires = hold_until
                    lease.released = True
                    return True
            del self._leases[key]
            return live

    def fence(self, key: str, token: str) -> int | None:
        """The key's next fencing token while ``token`` holds its live lease."""
        with self._lock:
            lease = self._live(key, self._clock())
            if lease is None or lease.token != token or lease.released:
                return None
            counter, _ = limited_key(key)  # one counter for all permits of a key
            self._fences[counter] = self._fences.get(counter, 0) + 1
            return self._fences[counter]

    def mark_rerun(self, key: str, payload: str) -> bool:
        """Mark ``key`` while a live lease (a mutex's) holds it."""
        with self._lock:
            now = self._clock()
            if self._live(key, now) is None:
                return False
            mark = self._marks.setdefault(key, _Mark())
            mark.payload, mark.marked = payload, now
            return True

    def take_rerun(self, key: str, token: str, taking: int) -> str | None:
        """Take ``key``'s mark while ``token`` holds it live; a take not above the last answers
        as that did (see ``BaseBackend.take_rerun``)."""
        with self._lock:
            now = self._clock()
            mark = self._marks.get(key)
            if mark is not None and mark.taken_by == token and taking <= mark.taken_number:
                return mark.taken if taking == mark.taken_number else None
            lease = self._live(key, now)
            if lease is None or lease.token != token or lease.released:
                return None
            mark = self._marks.setdefault(key, _Mark())
            fresh = now - mark.marked <= RERUN_LIFETIME.total_seconds()
            answer = mark.payload if fresh else None
            mark.taken_by, mark.taken_number, mark.taken = token, taking, answer
            mark.payload = None
            return answer

    def rerun_marks(self, key: str | None = None) -> dict[str, datetime]:
        with self._lock:
            now = self._clock()
            wall = datetime.now(timezone.utc)
            return {
                name: wall - timedelta(seconds=now - mark.marked)
                for name, mark in sorted(self._marks.items())
                if (key is None or name == key)
                and mark.payload is not None
                and now - mark.marked <= RERUN_LIFETIME.total_seconds()
            }

    def force_release(self, key: str, lease: str | None = None) -> HeldLock | None:
        """End ``key``'s live lease (only the one named ``lease``, when given)."""
        with self._lock:
            now = self._clock()
            found = self._live(key, now)
            if found is None or (lease is not None and lease_id(found.token) != lease):
                return None
            del self._leases[key]
            return self._held(key, found, now)

    def peek(self, key: str) -> HeldLock | None:
        with self._lock:
            now = self._clock()
            lease = self._live(key, now)
            return None if lease is None else self._held(key, lease, now)

    def list(self) -> list[HeldLock]:
        """Every live lease, ordered by key."""
        with self._lock:
            now = self._clock()
            return [
                self._held(key, lease, now)
                for key, lease in sorted(self._leases.items())
                if not self._is_free(lease, now)
            ]

    def reap_dead_holders(self, alive: Collection[str] = ()) -> Sequence[HeldLock]:
        """End every live lease whose holder is provably gone (not one cut for ``min_hold``).

        ``alive`` is not needed: every lease is looked at in memory, at no cost."""
        with self._lock:
            now = self._clock()
            dead = [
                (key, lease)
                for key, lease in sorted(self._leases.items())
                if not self._is_free(lease, now) and self._dead(lease)
            ]
            for key, _ in dead:
                del self._leases[key]
            return [self._held(key, lease, now) for key, lease in dead]

    def clear_stale(self, *, dry_run: bool = False) -> int:
        """Delete expired and 24 h old leases; return how many (or would be, with ``dry_run``)."""
        with self._lock:
            now = self._clock()
            stale = [key for key, lease in self._leases.items() if self._is_free(lease, now)]
            if not dry_run:
                for key in stale:
                    del self._leases[key]
            return len(stale)

    @staticmethod
    def _held(key: str, lease: _Lease, now: float) -> HeldLock:
        # HeldLock promises aware UTC whatever USE_TZ says, so not timezone.now().
        wall = datetime.now(timezone.utc)
        return HeldLock(
            key=key,
            holder=Holder.from_token(lease.token),
            acquired_at=wall - timedelta(seconds=now - lease.acquired),
            expires_at=wall + timedelta(seconds=lease.expires - now),
            seconds_left=lease.expires - now,
            lease=lease_id(lease.token),
            limit=lease.limit if PERMIT_SEPARATOR in key else None,
        )
