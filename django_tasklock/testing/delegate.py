"""A backend that passes every call to a real one: the base of test wrappers.

A wrapper that injects a fault into one call, or times it, overrides that
call and inherits the others, so every answer it does not change still comes
from real storage.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timedelta

from django_tasklock.backends.base import BaseBackend, HeldLock, Refresh, Released


class DelegatingBackend(BaseBackend):
    """Every call answered by ``inner``, whose capabilities it shares.

    All but ``watch``: a waiter on a wrapper polls, so that every look it
    takes goes through the calls the wrapper may change.
    """

    def __init__(self, inner: BaseBackend) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities  # type: ignore[misc]

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return self.inner.acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)

    def acquire_permit(
        self, key: str, token: str, *, limit: int, ttl: timedelta, max_lifetime: timedelta
    ) -> str | None:
        return self.inner.acquire_permit(
            key, token, limit=limit, ttl=ttl, max_lifetime=max_lifetime
        )

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return self.inner.refresh(key, token, ttl=ttl, max_lifetime=max_lifetime)

    def refresh_many(self, items: Sequence[Refresh]) -> list[bool]:
        return self.inner.refresh_many(items)

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        if min_hold is None:
            return self.inner.release(key, token)
        return self.inner.release(key, token, min_hold=min_hold)

    def release_outcome(
        self, key: str, token: str, *, min_hold: timedelta | None = None
    ) -> Released:
        if min_hold is None:
            return self.inner.release_outcome(key, token)
        return self.inner.release_outcome(key, token, min_hold=min_hold)

    def force_release(self, key: str, lease: str | None = None) -> HeldLock | None:
        return self.inner.force_release(key, lease)

    def peek(self, key: str) -> HeldLock | None:
        return self.inner.peek(key)

    def list(self) -> list[HeldLock]:
        return self.inner.list()

    def clear_stale(self, *, dry_run: bool = False) -> int:
        return self.inner.clear_stale(dry_run=dry_run)

    def fence(self, key: str, token: str) -> int | None:
        return self.inner.fence(key, token)

    def storage_time(self) -> float | None:
        return self.inner.storage_time()

    def mark_rerun(self, key: str, payload: str) -> bool:
        return self.inner.mark_rerun(key, payload)

    def take_rerun(self, key: str, token: str, taking: int) -> str | None:
        return self.inner.take_rerun(key, token, taking)

    def rerun_marks(self, key: str | None = None) -> dict[str, datetime]:
        return self.inner.rerun_marks(key)

    def reap_dead_holders(self, alive: Collection[str] = ()) -> Sequence[HeldLock]:
        return self.inner.reap_dead_holders(alive)

    def close(self) -> None:
        self.inner.close()
