"""Contract case: expiry by the storage's clock, not the worker's (capability ``server_clock``)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import BaseBackend
from django_tasklock.testing.support import LIFE, LONG, SLACK, ContractBackend, require

#: Far more than any lease in the case, so a worker judging by its own clock
#: is wrong about every one of them.
SKEW = timedelta(hours=2)


class ClockCases:
    """Workers with skewed clocks can neither steal a live lease nor keep a dead one."""

    def test_expiry_is_judged_by_the_storage_clock_not_the_workers(
        self, contract_backend: ContractBackend, backend: BaseBackend, key: str
    ) -> None:
        if not backend.capabilities.server_clock:
            pytest.skip(
                f"{contract_backend.name}: capability server_clock=False "
                "(expiry is judged by the worker's clock)"
            )
        skew = require(contract_backend, "skew_worker_clock")
        token = new_token()
        acquired = time.monotonic()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        short = new_token()
        assert backend.acquire(
            key + "-short", short, ttl=timedelta(seconds=0.3), max_lifetime=LIFE
        )
        with skew(SKEW) as ahead:
            # A worker 2 h ahead sees the live lease as live, with the storage's
            # time left, and neither takes nor sweeps it.
            assert not ahead.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
            held = ahead.peek(key)
            assert held is not None
            # What passed since the acquisition, not a fixed margin: a loaded
            # machine may take seconds to start the skewed worker.
            passed = time.monotonic() - acquired
            assert LONG.total_seconds() - passed - 1 <= held.seconds_left <= LONG.total_seconds()
            ahead.clear_stale()
            # Its refresh of a lease acquired a second ago is not capped by
            # max_lifetime, and its own lease ends by the storage's clock.
            refreshed = time.monotonic()
            assert ahead.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
            assert ahead.acquire(key + "-ahead", new_token(), ttl=LONG, max_lifetime=LIFE)
        held = backend.peek(key)
        assert held is not None
        assert held.seconds_left >= LONG.total_seconds() - (time.monotonic() - refreshed) - 1
        theirs = backend.peek(key + "-ahead")
        assert theirs is not None
        assert theirs.seconds_left <= LONG.total_seconds() + SLACK
        time.sleep(0.4)
        with skew(-SKEW) as behind:
            # A worker 2 h behind does not see an expired lease as live.
            assert behind.peek(key + "-short") is None
            assert not behind.refresh(key + "-short", short, ttl=LONG, max_lifetime=LIFE)
            assert behind.acquire(key + "-short", new_token(), ttl=LONG, max_lifetime=LIFE)
        for stored in (key, key + "-short", key + "-ahead"):
            backend.force_release(stored)

    def test_storage_time_is_the_clock_that_ends_leases(
        self, contract_backend: ContractBackend, backend: BaseBackend, key: str
    ) -> None:
        """``storage_time()``, when given, reads the clock by which leases end: a lease of
        ``ttl`` ends ``ttl`` after the reading taken as it was granted, by that clock."""
        first = backend.storage_time()
        if first is None:
            pytest.skip(f"{contract_backend.name}: storage_time() gives no clock (no clock check)")
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        held = backend.peek(key)
        second = backend.storage_time()
        assert held is not None
        assert second is not None
        # The grant was dated between the two readings, by the same clock.
        acquired = held.acquired_at.timestamp()
        assert first - SLACK <= acquired <= second + SLACK
        assert second - first <= 60  # seconds, not milliseconds
        backend.release(key, token)
