"""LeaderExecutor in this process: two APScheduler schedulers, one runs the jobs.

The real thing (three processes, a kill -9) is test_apscheduler_leader.py.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from django_tasklock import Leadership
from django_tasklock.testing import ContractBackend
from tests.support import processes


def scheduler(name: str, leadership: Leadership, ran: list[str]) -> Any:
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    from django_tasklock.contrib.apscheduler import LeaderExecutor

    made = BackgroundScheduler(
        executors={"default": LeaderExecutor(ThreadPoolExecutor(1), leadership)},
        timezone="UTC",
    )
    made.add_job(ran.append, "interval", seconds=0.1, args=[name], id="tick")
    return made


def wait(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not true in time"
        time.sleep(0.02)


def test_only_the_leaders_executor_runs_jobs_and_a_standby_takes_over(
    any_backend: ContractBackend, key: str
) -> None:
    processes.require_module("apscheduler")
    ran: list[str] = []
    first_lead = Leadership(key, ttl=5, retry_interval=0.05, backend=any_backend.backend)
    first = scheduler("first", first_lead, ran)
    first.start()
    wait(lambda: first_lead.is_leader)
    second_lead = Leadership(key, ttl=5, retry_interval=0.05, backend=any_backend.backend)
    second = scheduler("second", second_lead, ran)
    second.start()
    try:
        wait(lambda: ran.count("first") >= 3)
        assert "second" not in ran  # the standby ran nothing
        first.shutdown()  # lets go of the leadership
        handover = datetime.now(timezone.utc)
        wait(lambda: "second" in ran)
        assert second_lead.leader_since is not None
        assert second_lead.leader_since >= handover - timedelta(seconds=1)
    finally:
        second.shutdown()
        if first.running:
            first.shutdown()


def test_a_key_makes_a_leadership_with_its_options() -> None:
    processes.require_module("apscheduler")
    from apscheduler.executors.pool import ThreadPoolExecutor

    from django_tasklock.contrib.apscheduler import LeaderExecutor

    executor = LeaderExecutor(ThreadPoolExecutor(), "nightly", ttl=12)
    assert executor.leadership.key == "nightly"
    assert executor.leadership.ttl == timedelta(seconds=12)
    with pytest.raises(ValueError, match="retry_interval must be positive"):
        LeaderExecutor(ThreadPoolExecutor(), "nightly", retry_interval=0)


def test_a_force_released_leader_runs_nothing_more_after_its_next_look(
    any_backend: ContractBackend, key: str
) -> None:
    # Before: the leadership thread's poll() trusted the lease until the
    # heartbeat's next refresh (ttl / 3 = 10 s here): the old leader kept
    # running the job every 0.1 s while the new leader ran it too.
    processes.require_module("apscheduler")
    ran: list[str] = []
    first_lead = Leadership(key, ttl=30, retry_interval=0.2, backend=any_backend.backend)
    first = scheduler("first", first_lead, ran)
    first.start()
    try:
        wait(lambda: ran.count("first") >= 3)
        # The operator's release and the new leader's grant land between two
        # looks of the old leader (its poll waits on its mutex meanwhile): a
        # look in between would find the key free and rightly take it back.
        with first_lead._mutex:
            assert any_backend.backend.force_release(key) is not None
            second_lead = Leadership(key, ttl=30, backend=any_backend.backend)
            assert second_lead.poll()  # the new leader, from now on
        wait(lambda: not first_lead.is_leader, timeout=5)  # its next look, 0.2 s on
        time.sleep(1)  # a run submitted before it looked may still be on its way
        after = ran.count("first")
        time.sleep(1.5)
        assert ran.count("first") == after
        second_lead.stop()
    finally:
        first.shutdown()
