"""A backend that fails on purpose, for faults a test cannot cause for real."""

from __future__ import annotations

import time
from datetime import timedelta

from django_tasklock.backends.base import BaseBackend, HeldLock, Released


class InjectedFault(ConnectionError):
    """Raised by :class:`FaultyBackend` where a real storage would be unreachable."""


class FaultyBackend(BaseBackend):
    """Wraps a real backend; its first ``refresh_failures`` refreshes, and every
    release when ``release_fails``, raise :class:`InjectedFault` instead.

    ``late_refreshes``: that many refreshes (after the failures) answer
    ``late_by`` seconds after the storage acted, as a reply held up on its way.
    ``refresh_answers`` counts the refreshes answered."""

    def __init__(
        self,
        inner: BaseBackend,
        *,
        refresh_failures: int = 0,
        release_fails: bool = False,
        late_refreshes: int = 0,
        late_by: float = 0.0,
    ) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities  # type: ignore[misc]
        self.refresh_failures = refresh_failures
        self.release_fails = release_fails
        self.late_refreshes = late_refreshes
        self.late_by = late_by
        self.refresh_calls = 0
        self.refresh_answers = 0

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return self.inner.acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        self.refresh_calls += 1
        if self.refresh_calls <= self.refresh_failures:
            raise InjectedFault("injected refresh failure")
        answer = self.inner.refresh(key, token, ttl=ttl, max_lifetime=max_lifetime)
        if self.refresh_calls <= self.refresh_failures + self.late_refreshes:
            time.sleep(self.late_by)
        self.refresh_answers += 1
        return answer

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        if self.release_fails:
            raise InjectedFault("injected release failure")
        if min_hold is None:
            return self.inner.release(key, token)
        return self.inner.release(key, token, min_hold=min_hold)

    def release_outcome(
        self, key: str, token: str, *, min_hold: timedelta | None = None
    ) -> Released:
        if self.release_fails:
            raise InjectedFault("injected release failure")
        return self.inner.release_outcome(key, token, min_hold=min_hold)

    def fence(self, key: str, token: str) -> int | None:
        return self.inner.fence(key, token)

    def force_release(self, key: str, lease: str | None = None) -> HeldLock | None:
        return self.inner.force_release(key, lease)

    def peek(self, key: str) -> HeldLock | None:
        return self.inner.peek(key)

    def list(self) -> list[HeldLock]:
        return self.inner.list()

    def clear_stale(self, *, dry_run: bool = False) -> int:
        return self.inner.clear_stale(dry_run=dry_run)

    def close(self) -> None:
        self.inner.close()
