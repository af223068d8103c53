"""Backends with exactly one bug each, which the contract suite must catch.

Each is a subclass of a correct backend overriding one method. They live
apart from the tests that use them so that a child process (the contract's
``faketime`` worker) can import them by dotted path.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta

from django.db.models.functions import Now
from django.utils import timezone

from django_tasklock.backends.base import (
    PERMIT_SEPARATOR,
    STALE_AFTER,
    Capabilities,
    Holder,
    permit_key,
    storage_key,
)
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.memory import MemoryBackend, _Lease
from django_tasklock.processes import holder_gone, this_machine

# -- on the memory backend -------------------------------------------------------------


class ClearStaleReturnsZero(MemoryBackend):
    def clear_stale(self, *, dry_run: bool = False) -> int:
        super().clear_stale(dry_run=dry_run)
        return 0


class ClearStaleDoesNothing(MemoryBackend):
    def clear_stale(self, *, dry_run: bool = False) -> int:
        return 0


class DryRunDeletes(MemoryBackend):
    def clear_stale(self, *, dry_run: bool = False) -> int:
        return super().clear_stale()


class RefreshResurrects(MemoryBackend):
    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        with self._lock:
            lease = self._leases.get(key)
            if lease is None or lease.token != token:
                return False
            lease.expires = self._clock() + ttl.total_seconds()
            return True


class RefreshIgnoresCap(MemoryBackend):
    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return super().refresh(key, token, ttl=ttl, max_lifetime=STALE_AFTER)


class AcquireIgnoresMaxLifetime(MemoryBackend):
    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        taken = super().acquire(key, token, ttl=ttl, max_lifetime=STALE_AFTER)
        if taken:  # the cap is still recorded for refresh, only the first lease ignores it
            lease = self._leases[key]
            lease.expires = lease.acquired + ttl.total_seconds()
        return taken


class ReleaseNotBoundToToken(MemoryBackend):
    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        return self.force_release(key) is not None


class RefreshNotBoundToToken(MemoryBackend):
    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        lease = self._leases.get(key)
        owner = lease.token if lease is not None else token
        return super().refresh(key, owner, ttl=ttl, max_lifetime=max_lifetime)


class AcquireNotExcluding(MemoryBackend):
    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        with self._lock:
            now = self._clock()
            expires = now + min(ttl, max_lifetime).total_seconds()
            self._leases[key] = _Lease(token=token, acquired=now, expires=expires)
            return True


class ExpiredNeverTakenOver(MemoryBackend):
    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        if key in self._leases:
            return False
        return super().acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)


class AbandonedNeverTakenOver(MemoryBackend):
    @staticmethod
    def _is_free(lease: _Lease, now: float) -> bool:
        return lease.expires <= now


class ListIncludesExpired(MemoryBackend):
    def list(self) -> list:  # type: ignore[type-arg]
        with self._lock:
            now = self._clock()
            return [self._held(k, lease, now) for k, lease in sorted(self._leases.items())]


class PeekIgnoresExpiry(MemoryBackend):
    def peek(self, key: str):  # type: ignore[no-untyped-def]
        with self._lock:
            lease = self._leases.get(key)
            return None if lease is None else self._held(key, lease, self._clock())


class TakesOverTheLiving(MemoryBackend):
    """Takes over any holder of this machine, alive or not."""

    @staticmethod
    def _dead(lease: _Lease) -> bool:
        return not lease.released and Holder.from_token(lease.token).machine == this_machine()


class DeadHolderKeepsTheKey(MemoryBackend):
    @staticmethod
    def _dead(lease: _Lease) -> bool:
        return False


class TakesOverAMinHold(MemoryBackend):
    """Takes over a dead holder's lease even when its release cut it for ``min_hold``."""

    @staticmethod
    def _dead(lease: _Lease) -> bool:
        return holder_gone(Holder.from_token(lease.token)) is True


class ReapsTheLiving(MemoryBackend):
    """Reaps every lease of this machine."""

    def reap_dead_holders(self, alive: Collection[str] = ()) -> list:  # type: ignore[type-arg]
        with self._lock:
            now = self._clock()
            ours = [
                key
                for key, lease in self._leases.items()
                if Holder.from_token(lease.token).machine == this_machine()
            ]
            return [self._held(key, self._leases.pop(key), now) for key in ours]


class GivesAPermitTwice(MemoryBackend):
    """Gives the first permit of a limited key to whoever asks, held or not."""

    def acquire_permit(
        self, key: str, token: str, *, limit: int, ttl: timedelta, max_lifetime: timedelta
    ) -> str | None:
        with self._lock:
            now = self._clock()
            self._limits[key] = limit
            name = permit_key(key, 0)
            expires = now + min(ttl, max_lifetime).total_seconds()
            self._leases[name] = _Lease(token=token, acquired=now, expires=expires, limit=limit)
            return name


class MixesLimits(MemoryBackend):
    """Serves a key whatever limit its held permits, or its mutex lease, were taken with."""

    def _live_permits(self, key: str, now: float) -> list[tuple[str, _Lease]]:
        return []  # never finds permits of another limit, nor permits where a mutex asks

    def _live(self, key: str, now: float) -> _Lease | None:
        if PERMIT_SEPARATOR not in key and key in self._limits:
            return None  # a limited key's mutex lease, unseen by its permits' takers
        return super()._live(key, now)


class ServerClockMemory(MemoryBackend):
    """A model of a storage with its own clock, for the ``server_clock`` case.

    ``worker(offset)`` is the same storage as seen by a worker whose clock is
    ``offset`` off: a correct backend ignores that clock and judges by the
    storage's.
    """

    capabilities = Capabilities(cross_process=False, server_clock=True)

    def worker(self, offset: timedelta) -> MemoryBackend:
        view = type(self)(clock=self._worker_clock(offset))
        view._leases, view._lock = self._leases, self._lock
        return view

    def _worker_clock(self, offset: timedelta):  # type: ignore[no-untyped-def]
        return self._clock


class JudgesByWorkerClock(ServerClockMemory):
    def _worker_clock(self, offset: timedelta):  # type: ignore[no-untyped-def]
        return lambda: self._clock() + offset.total_seconds()


# -- on the database backend -----------------------------------------------------------


class ClearStaleOutsideTheNamespace(DatabaseBackend):
    def clear_stale(self, *, dry_run: bool = False) -> int:
        rows = self._model().objects.using(self.using).filter(expires_at__lte=Now())
        return rows.count() if dry_run else rows._raw_delete(self.using)


class DatabaseAcquireIgnoresMaxLifetime(DatabaseBackend):
    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return super().acquire(key, token, ttl=ttl, max_lifetime=max(ttl, max_lifetime))


class DatabaseJudgesByWorkerClock(DatabaseBackend):
    """Writes and reads expiry by ``timezone.now()``: the worker's clock, not the server's."""

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        model, stored, now = self._model(), storage_key(key), timezone.now()
        rows = model.objects.using(self.using)
        rows.filter(key=stored, expires_at__lte=now)._raw_delete(self.using)
        if rows.filter(key=stored).exists():
            return False
        rows.create(
            key=stored, value=token, expires_at=now + min(ttl, max_lifetime), created_at=now
        )
        return True
