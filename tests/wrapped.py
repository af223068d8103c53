"""A backend that passes every call to a real one, with hooks for the deadline tests.

Only instrumentation and the faults a test cannot cause at will around one
call (an acquisition whose request is slow on its way, refreshes sent to a
storage that refuses connections): every answer still comes from real storage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

from django_tasklock.backends.base import BaseBackend, HeldLock, Refresh
from django_tasklock.lease import clock


class Wrapped(BaseBackend):
    """``inner``'s answers; ``acquire_delay`` seconds spent before each acquisition is sent;
    refreshes sent to ``refresh_to`` when given; ``answered`` lists when each
    refresh call answered and whether any answer was "not ours"."""

    def __init__(self, inner: BaseBackend, *, refresh_to: BaseBackend | None = None) -> None:
        self.inner = inner
        self.refresh_to = refresh_to
        self.acquire_delay = 0.0
        self.answered: list[tuple[float, bool]] = []
        self.capabilities = inner.capabilities  # type: ignore[misc]

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        time.sleep(self.acquire_delay)
        return self.inner.acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return self.refresh_many([Refresh(key, token, ttl, max_lifetime)])[0]

    def refresh_many(self, items: Sequence[Refresh]) -> list[bool]:
        answers = (self.refresh_to or self.inner).refresh_many(items)
        self.answered.append((clock(), not all(answers)))
        return answers

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        if min_hold is None:
            return self.inner.release(key, token)
        return self.inner.release(key, token, min_hold=min_hold)

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

    def close(self) -> None:
        self.inner.close()
        if self.refresh_to is not None:
            self.refresh_to.close()
