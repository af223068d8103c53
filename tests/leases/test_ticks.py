"""This process's heartbeat as the health checks judge it: its ticks (``ticks``), noted
by the real heartbeat or by hand, and the W012 finding they make; its failed refreshes
(W014).

``test_health_stall.py`` stalls a real heartbeat.
"""

from __future__ import annotations

import os
import time

import pytest

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.checks import check_lock_health
from django_tasklock.leases import ticks
from django_tasklock.leases.lease import Lease, clock
from django_tasklock.leases.tokens import this_process
from django_tasklock.locking.options import LockOptions
from django_tasklock.ops import health


def test_a_tick_is_behind_while_it_runs_past_its_interval() -> None:
    tick = ticks.Tick(started=100.0, refresh_interval=2.0, leases=3)
    assert not tick.behind(now=101.9)
    assert tick.behind(now=102.1)
    assert tick.seconds(now=105.0) == 5.0


def test_a_finished_slow_tick_counts_until_two_intervals_after_it_ended() -> None:
    slow = ticks.Tick(started=100.0, refresh_interval=2.0, leases=1, ended=103.0)
    assert slow.behind(now=104.9)
    assert not slow.behind(now=107.1)  # the heartbeat went idle: nothing ticks any more
    quick = ticks.Tick(started=100.0, refresh_interval=2.0, leases=1, ended=101.0)
    assert not quick.behind(now=101.5)


def test_the_heartbeat_notes_its_ticks(no_ticks: None, key: str) -> None:
    taken = clock()
    with TaskLockService(MemoryBackend()).lock(key, ttl=2, refresh_interval=0.1):
        deadline = time.monotonic() + 10
        # Another test's leases may still be ticking (in a backend group of their
        # own), and an earlier test's last tick is still noted: wait for a finished
        # tick of this lease's group.
        tick = None
        while tick is None and time.monotonic() < deadline:
            time.sleep(0.01)
            last = ticks.last_tick()
            if (
                last is not None
                and last.started >= taken
                and last.ended is not None
                and last.refresh_interval < 0.15
            ):
                tick = last
    assert tick is not None
    assert tick.ended is not None
    assert tick.refresh_interval == pytest.approx(0.1)
    assert tick.leases >= 1
    assert health.heartbeat_findings() == []  # a quick tick


@pytest.mark.filterwarnings("ignore:.*use of fork.. may lead to deadlocks:DeprecationWarning")
def test_a_forked_child_does_not_inherit_a_tick_under_way(no_ticks: None) -> None:
    ticks._last = ticks.Tick(started=0.0, refresh_interval=1.0, leases=1)
    ticks._recent = (ticks._last,)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        seen = ticks.last_tick() is None and ticks.recent_ticks() == []
        os.write(write, b"none" if seen else b"tick")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 10)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"none"


def test_heartbeat_finding_describes_the_tick(no_ticks: None) -> None:
    ticks._last = ticks.Tick(started=clock() - 5, refresh_interval=1.0, leases=1)
    ticks._recent = (ticks._last,)
    [finding] = health.heartbeat_findings()
    assert finding.under_way
    assert finding.describe().startswith(
        "This process's heartbeat is behind: its latest tick has run for 5."
    )
    assert finding.describe().endswith("longer than the refresh interval (1.0 s).")
    [message] = check_lock_health()
    assert message.id == "django_tasklock.W012"


def test_a_slow_tick_counts_whatever_quick_ticks_follow(
    no_ticks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow tick, then the quick ones the heartbeat runs at once after it (of another
    backend, and of its own, whose leases are overdue): behind until two of the slow
    tick's intervals after it ended, and the slowest tick is the one reported."""
    now = [100.0]
    monkeypatch.setattr(ticks, "clock", lambda: now[0])
    monkeypatch.setattr(health, "clock", lambda: now[0])

    def lease(refresh_interval: float) -> list[Lease]:
        options = LockOptions.resolve(ttl=10, refresh_interval=refresh_interval)
        return [Lease(MemoryBackend(), "k", "t", this_process(), options, asked_at=now[0])]

    def tick(leases: list[Lease], seconds: float) -> None:
        started = ticks.tick_started(leases)
        now[0] += seconds
        ticks.tick_ended(started)

    one, other = lease(refresh_interval=1.0), lease(refresh_interval=0.5)
    tick(one, 3.0)  # ends at 103
    tick(other, 1.5)  # slow too, but less; ends at 104.5
    tick(other, 0.01)
    tick(one, 0.01)
    last = ticks.last_tick()
    assert last is not None
    assert not last.behind()  # the latest tick alone would say "not behind"
    [finding] = health.heartbeat_findings()
    assert (finding.seconds, finding.limit, finding.under_way) == (3.0, 1.0, False)
    assert finding.describe() == (
        "This process's heartbeat is behind: a recent tick took 3.0 s, "
        "longer than the refresh interval (1.0 s)."
    )
    now[0] = 105.1  # two intervals after the slowest ended, not yet after the other
    assert [f.seconds for f in health.heartbeat_findings()] == [1.5]
    now[0] = 105.6
    assert health.heartbeat_findings() == []
    assert ticks.recent_ticks() == []


def test_failed_refreshes_are_reported_until_answered_or_their_leases_ran_out(
    no_ticks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W014's record: from the first failure in a row, until a refresh is answered
    there, or the longest ttl of the leases that failed has passed since the latest."""
    now = [100.0]
    monkeypatch.setattr(ticks, "clock", lambda: now[0])
    monkeypatch.setattr(health, "clock", lambda: now[0])
    down, other = MemoryBackend(), MemoryBackend()
    options = LockOptions.resolve(ttl=10, refresh_interval=1)
    leases = [Lease(down, "k", "t", this_process(), options, asked_at=now[0])]
    ticks.refresh_failed(down, leases, ConnectionError("refused"))
    now[0] = 103.0
    ticks.refresh_failed(down, leases, TimeoutError("timed out"))
    [finding] = health.heartbeat_findings()
    assert finding.kind == health.STORAGE_UNREACHABLE
    assert (finding.seconds, finding.limit, finding.error) == (3.0, 0.0, "TimeoutError")
    ticks.refresh_answered(other)  # another storage's answer ends nothing here
    assert len(health.heartbeat_findings()) == 1
    now[0] = 113.0  # the lease's ttl since the latest failure: it may still live
    assert len(health.heartbeat_findings()) == 1
    now[0] = 113.1  # it has run out in the storage too
    assert health.heartbeat_findings() == []
    ticks.refresh_failed(down, leases, ConnectionError("refused"))
    assert [m.id for m in check_lock_health()] == ["django_tasklock.W014"]
    ticks.refresh_answered(down)
    assert health.heartbeat_findings() == []
    assert check_lock_health() == []
