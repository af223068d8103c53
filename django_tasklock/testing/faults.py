"""A backend that fails on purpose, for faults a test cannot cause for real."""

from __future__ import annotations

import time
from datetime import timedelta

from django_tasklock.backends.base import BaseBackend, Released
from django_tasklock.testing.delegate import DelegatingBackend


class InjectedFault(ConnectionError):
    """Raised by :class:`FaultyBackend` where a real storage would be unreachable."""


class FaultyBackend(DelegatingBackend):
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
        super().__init__(inner)
        self.refresh_failures = refresh_failures
        self.release_fails = release_fails
        self.late_refreshes = late_refreshes
        self.late_by = late_by
        self.refresh_calls = 0
        self.refresh_answers = 0

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        self.refresh_calls += 1
        if self.refresh_calls <= self.refresh_failures:
            raise InjectedFault("injected refresh failure")
        answer = self.inner.refresh(key, token, ttl=ttl, max_lifetime=max_lifetime)
        if self.refresh_calls <= self.refresh_failures + self.late_refreshes:
            time.sleep(self.late_by)
        self.refresh_answers += 1
        return answer

    #: One :meth:`refresh` per lease, so that each meets the faults above.
    refresh_many = BaseBackend.refresh_many

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        if self.release_fails:
            raise InjectedFault("injected release failure")
        return super().release(key, token, min_hold=min_hold)

    def release_outcome(
        self, key: str, token: str, *, min_hold: timedelta | None = None
    ) -> Released:
        if self.release_fails:
            raise InjectedFault("injected release failure")
        return super().release_outcome(key, token, min_hold=min_hold)
