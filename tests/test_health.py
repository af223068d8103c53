"""Lock health: TASKLOCK_HEALTH, the findings, and the deploy check (``--tag tasklock``).

The leases judged here are planted in real storage (acquired long ago, or
with little time left); ``test_health_stall.py`` stalls a real heartbeat.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_tasklock import health, ticks
from django_tasklock.backends.base import storage_key
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.checks import check_health_setting, check_lock_health
from django_tasklock.lease import Lease, clock
from django_tasklock.options import LockOptions
from django_tasklock.service import new_token
from django_tasklock.testing import ContractBackend
from django_tasklock.tokens import this_process
from tests.conftest import runs_manage_py_check

# -- TASKLOCK_HEALTH -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([("a", 1)], "TASKLOCK_HEALTH must be a dict of key patterns to limits, not list"),
        ({"": 60}, "TASKLOCK_HEALTH has the key '': each key must be a key pattern"),
        ({3: 60}, "TASKLOCK_HEALTH has the key 3"),
        ({"a:*": -1}, r"TASKLOCK_HEALTH\['a:\*'\] must be positive, got -1"),
        ({"a:*": "1h"}, r"TASKLOCK_HEALTH\['a:\*'\] must be seconds \(int or float\)"),
        ({"a": {"max_held": 0}}, r"TASKLOCK_HEALTH\['a'\]\['max_held'\] must be positive"),
        ({"a": {"max_held": 86401}}, r"TASKLOCK_HEALTH\['a'\]\['max_held'\] must be at most 24"),
        ({"a": {"max_hold": 60}}, r"TASKLOCK_HEALTH\['a'\] has unknown keys \['max_hold'\]"),
        (
            {"a": {"ttl": 10, "refresh_interval": 10}},
            r"TASKLOCK_HEALTH\['a'\]: refresh_interval must be less than ttl",
        ),
        ({"a": {"ttl": True}}, r"TASKLOCK_HEALTH\['a'\]: ttl must be seconds"),
    ],
)
def test_bad_setting_is_refused_naming_it(value: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        health.limits(value)
    with override_settings(TASKLOCK_HEALTH=value):
        [error] = check_health_setting()
    assert error.id == "django_tasklock.E010"
    assert error.msg.startswith("TASKLOCK_HEALTH")
    assert error.hint


def test_absent_setting_judges_no_lease() -> None:
    assert health.limits() == []
    assert check_health_setting() == []


def test_an_entry_is_max_held_or_a_dict_using_the_locks_own_defaults() -> None:
    with override_settings(TASKLOCK_DEFAULTS={"ttl": 90}):
        short, full = health.limits(
            {
                "a:*": timedelta(minutes=5),
                "b:*": {"max_held": 600, "ttl": 60, "refresh_interval": 5, "max_lifetime": 3600},
            }
        )
    assert (short.max_held, short.options.ttl, short.options.refresh_interval) == (
        timedelta(minutes=5),
        timedelta(seconds=90),  # TASKLOCK_DEFAULTS, as a lock taken without options
        timedelta(seconds=30),  # a third of it
    )
    assert (full.max_held, full.options.refresh_interval, full.options.max_lifetime) == (
        timedelta(minutes=10),
        timedelta(seconds=5),
        timedelta(hours=1),
    )


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("nightly-report", "nightly-report", True),
        ("nightly-report", "nightly-report-2", False),
        ("sync:*", "sync:", True),
        ("sync:*", "sync:42:eu", True),
        ("sync:*", "async:42", False),
        ("sync:{account}", "sync:42", True),  # an @exclusive template, as written there
        ("sync:{account}", "sync:", False),  # a field is never empty
        ("sync:{account}:{region}", "sync:42:eu", True),
        ("a.b+[c]", "a.b+[c]", True),  # nothing else is special
        ("a.b+[c]", "aXb+c", False),
        ("*", "anything at all\n", True),
    ],
)
def test_patterns(pattern: str, key: str, matches: bool) -> None:
    [entry] = health.limits({pattern: 60})
    assert entry.matches(key) is matches


# -- leases as the storage shows them -----------------------------------------------

HEALTH = {
    # In order: a key is judged by the first pattern it matches.
    "{key}-capped": {"ttl": 600, "refresh_interval": 60, "max_lifetime": 3600},
    "{key}-*": {"max_held": 3600, "ttl": 600, "refresh_interval": 60},
}


def _plant_leases(backend: ContractBackend, key: str) -> None:
    plant = backend.plant
    assert plant is not None
    minute = timedelta(minutes=1)
    # (acquired this long ago, this long left), by the storage's clock
    for name, ago, left in [
        ("long", 2 * 60 + 3.5, 9.9),  # held 2 h 03 min > 1 h; refreshed 6 s ago
        ("late", 10, 3),  # refreshed 7 min ago: more than two intervals
        ("fine", 10, 9.9),  # held 10 min, refreshed 6 s ago
        ("capped", 59.9, 0.1),  # at acquisition + max_lifetime: no longer extended
    ]:
        plant(storage_key(f"{key}-{name}"), new_token(), ago * minute, left * minute)
    plant(storage_key(f"other-{key}"), new_token(), 5 * 60 * minute, minute)  # no entry


def test_leases_held_too_long_or_not_refreshed_on_time(
    active_backend: ContractBackend, key: str
) -> None:
    _plant_leases(active_backend, key)
    entries = health.limits({pattern.format(key=key): entry for pattern, entry in HEALTH.items()})

    found = health.lease_findings(active_backend.backend.list(), entries)

    assert [(f.kind, f.key, f.pattern) for f in found] == [  # list() orders by key
        (health.REFRESH_OVERDUE, f"{key}-late", f"{key}-*"),
        (health.HELD_TOO_LONG, f"{key}-long", f"{key}-*"),
    ]
    late, long = found
    assert long.seconds == pytest.approx(123.5 * 60, abs=30)
    assert long.limit == 3600
    assert late.seconds == pytest.approx(7 * 60, abs=30)
    assert late.limit == 60
    assert long.describe() == (
        f"'{key}-long' has been held for 2 h 03 min, longer than the 1 h 00 min that "
        f"TASKLOCK_HEALTH['{key}-*'] allows."
    )
    assert late.describe(key=False).startswith(
        f"A lock matching '{key}-*' was last refreshed 7 min"
    )
    assert late.describe(key=False).endswith(
        "ago, more than twice its refresh interval (1 min 00 s): its holder's heartbeat is behind."
    )


def test_deploy_check_reports_each_lease_by_key(active_backend: ContractBackend, key: str) -> None:
    _plant_leases(active_backend, key)
    setting = {pattern.format(key=key): entry for pattern, entry in HEALTH.items()}
    with override_settings(TASKLOCK_HEALTH=setting):
        messages = check_lock_health()
    assert [(m.id, m.msg.split()[0]) for m in messages] == [
        ("django_tasklock.W011", f"'{key}-late'"),
        ("django_tasklock.W010", f"'{key}-long'"),
    ]
    assert all(m.hint for m in messages)


@runs_manage_py_check
def test_manage_py_check_deploy_tag_tasklock_runs_it(
    active_backend: ContractBackend, key: str
) -> None:
    _plant_leases(active_backend, key)
    setting = {pattern.format(key=key): entry for pattern, entry in HEALTH.items()}
    with override_settings(TASKLOCK_HEALTH=setting):
        call_command("check", "--tag", "tasklock")  # not a deploy run: the storage is not read
        call_command("check", "--deploy", "--tag", "tasklock")  # warnings only: passes
        with pytest.raises(SystemCheckError) as info:
            call_command("check", "--deploy", "--tag", "tasklock", "--fail-level", "WARNING")
    assert "django_tasklock.W010" in str(info.value)
    assert f"'{key}-long' has been held for 2 h 03 min" in str(info.value)
    assert "django_tasklock.W011" in str(info.value)


def test_an_unreadable_storage_is_a_warning_not_a_crash() -> None:
    with override_settings(
        TASKLOCK_BACKEND="redis",
        TASKLOCK_REDIS_URL="redis://127.0.0.1:1/0",
        TASKLOCK_HEALTH={"*": 60},
    ):
        [message] = check_lock_health()
    assert message.id == "django_tasklock.W013"
    assert message.msg.startswith("Could not list the task locks to check their health: ")


def test_without_the_setting_the_check_reads_no_storage() -> None:
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL="redis://127.0.0.1:1/0"):
        assert check_lock_health() == []


# -- this process's heartbeat -------------------------------------------------------


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


def test_the_heartbeat_notes_its_ticks(key: str) -> None:
    import time

    from django_tasklock.backends.memory import MemoryBackend
    from django_tasklock.service import TaskLockService

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


@pytest.fixture
def noted() -> Iterator[None]:
    """The ticks a test notes by hand, instead of the heartbeat's (put back after it)."""
    saved = ticks._last, ticks._recent
    try:
        yield
    finally:
        ticks._last, ticks._recent = saved


@pytest.mark.filterwarnings("ignore:.*use of fork.. may lead to deadlocks:DeprecationWarning")
def test_a_forked_child_does_not_inherit_a_tick_under_way(noted: None) -> None:
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


def test_heartbeat_finding_describes_the_tick(noted: None) -> None:
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
    noted: None, monkeypatch: pytest.MonkeyPatch
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


def test_an_invalid_setting_is_left_to_e010_by_the_deploy_check() -> None:
    with override_settings(TASKLOCK_HEALTH={"": 60}):
        assert check_lock_health() == []
        assert [m.id for m in check_health_setting()] == ["django_tasklock.E010"]
