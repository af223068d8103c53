"""A backend that passes every call to a real one, with hooks for the deadline tests.

Only instrumentation and the faults a test cannot cause at will around one
call (an acquisition whose request is slow on its way, refreshes sent to a
storage that refuses connections): every answer still comes from real storage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

from django_tasklock.backends.base import BaseBackend, Refresh
from django_tasklock.leases.lease import clock
from django_tasklock.testing.delegate import DelegatingBackend


class Wrapped(DelegatingBackend):
    """``inner``'s answers; ``acquire_delay`` seconds spent before each acquisition is sent;
    refreshes sent to ``refresh_to`` when given; ``answered`` lists when each
    refresh call answered and whether any answer was "not ours"."""

    def __init__(self, inner: BaseBackend, *, refresh_to: BaseBackend | None = None) -> None:
        super().__init__(inner)
        self.refresh_to = refresh_to
        self.acquire_delay = 0.0
        self.answered: list[tuple[float, bool]] = []

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        time.sleep(self.acquire_delay)
        return self.inner.acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return self.refresh_many([Refresh(key, token, ttl, max_lifetime)])[0]

    def refresh_many(self, items: Sequence[Refresh]) -> list[bool]:
        answers = (self.refresh_to or self.inner).refresh_many(items)
        self.answered.append((clock(), not all(answers)))
        return answers

    def close(self) -> None:
        self.inner.close()
        if self.refresh_to is not None:
            self.refresh_to.close()
