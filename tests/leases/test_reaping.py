"""The heartbeat's reaping of dead holders: when it runs, and a reap that fails.

What it ends, with real processes, is in ``test_dead_holders.py`` and the
contract's ``cases_dead``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from typing import Any

import pytest

from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.leases.lease import clock, new_token
from django_tasklock.leases.reaping import REAP_INTERVAL, Reaper
from django_tasklock.processes import this_machine


def test_a_reap_that_fails_is_said_once_until_one_works_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Best effort: unreaped, a dead holder's lease still ends by its ttl."""
    if this_machine() is None:
        pytest.skip("no /proc here: nothing is reaped")
    broken = DatabaseBackend(using="no-such-database")  # ImproperlyConfigured, for real
    reaper = Reaper()
    with caplog.at_level(logging.DEBUG, logger="django_tasklock"):
        reaper.reap({broken: ()})
        reaper.reap({broken: ()})
    said = [r.levelno for r in caplog.records if "Reaping" in r.getMessage()]
    assert said == [logging.INFO, logging.DEBUG]
    assert reaper.due_at >= clock() + REAP_INTERVAL - 1


@pytest.mark.databases
def test_the_next_reap_is_an_interval_away(caplog: pytest.LogCaptureFixture) -> None:
    if this_machine() is None:
        pytest.skip("no /proc here: nothing is reaped")
    reaper = Reaper()
    before = clock()
    reaper.reap({DatabaseBackend(using="default"): ()})
    assert reaper.due_at >= before + REAP_INTERVAL
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_a_reaped_permit_is_named_by_its_key_and_number(caplog: pytest.LogCaptureFixture) -> None:
    """Never the permit's stored name (the key, U+001F, the number) in the log."""
    from datetime import timedelta

    from django_tasklock.backends.memory import MemoryBackend
    from django_tasklock.testing.cases_dead import dead_token, proofs_here
    from django_tasklock.testing.support import wait_until

    proofs_here()
    backend = MemoryBackend()
    hour = timedelta(hours=1)
    for token in (new_token(), dead_token()):
        assert backend.acquire_permit("exports", token, limit=2, ttl=hour, max_lifetime=hour)
    with caplog.at_level(logging.INFO, logger="django_tasklock"):
        Reaper().reap({backend: ()})
        wait_until(lambda: any("Freed" in r.getMessage() for r in caplog.records), timeout=15)
    [said] = [r.getMessage() for r in caplog.records if "Freed" in r.getMessage()]
    assert said.startswith("Freed task lock 'exports' (permit 1): its holder, host ")
    assert "\x1f" not in said


def test_the_heartbeat_names_its_own_leases_to_the_reap() -> None:
    """Passed on as ``alive``: a backend need not look at them (Redis sends them no script)."""
    from django_tasklock.api.service import TaskLockService
    from django_tasklock.backends.memory import MemoryBackend
    from django_tasklock.leases.heartbeat import heartbeat
    from django_tasklock.testing.support import wait_until

    if this_machine() is None:
        pytest.skip("no /proc here: nothing is reaped")

    class Recording(MemoryBackend):
        def __init__(self) -> None:
            super().__init__()
            self.alive: list[set[str]] = []

        def reap_dead_holders(self, alive: Collection[str] = ()) -> list[Any]:
            self.alive.append(set(alive))
            return list(super().reap_dead_holders(alive))

    backend = Recording()
    service = TaskLockService(backend)
    with service.lock("reaped-around", ttl=5, refresh_interval=0.2):
        heartbeat()._reaper.due_at = -math.inf  # due now: at its next wake-up
        wait_until(lambda: bool(backend.alive), timeout=30)
    assert backend.alive[0] == {"reaped-around"}
