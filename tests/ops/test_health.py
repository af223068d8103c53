"""Lock health: TASKLOCK_HEALTH, the findings, and the deploy check (``--tag tasklock``).

The leases judged here are planted in real storage (acquired long ago, or
with little time left); ``test_ticks.py`` judges this process's heartbeat, and
``test_health_stall.py`` stalls a real one.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_tasklock.api.service import new_token
from django_tasklock.api.unique import claim, unclaim
from django_tasklock.backends.base import storage_key
from django_tasklock.checks import check_health_setting, check_lock_health
from django_tasklock.ops import health
from django_tasklock.testing import ContractBackend
from tests.conftest import runs_manage_py_check

LIFE = timedelta(hours=1)

# An earlier test's slow tick or unreachable storage in this process (W012, W014)
# would be this test's finding.
pytestmark = pytest.mark.usefixtures("no_ticks")

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
    # What was measured (the time left), and what was counted from it (by the entry's ttl).
    assert re.match(
        rf"A lock matching '{key}-\*' has (3 min 00|2 min 59) s of its lease left; with the "
        rf"ttl that TASKLOCK_HEALTH\['{key}-\*'\] gives \(10 min 00 s\), it was last "
        "refreshed 7 min",
        late.describe(key=False),
    )
    assert late.describe(key=False).endswith(
        "ago, more than twice its refresh interval (1 min 00 s): its holder's heartbeat is "
        "behind, or its lock uses another ttl than the entry."
    )


def test_an_entry_whose_ttl_is_not_the_locks_says_so_never_a_late_refresh(
    active_backend: ContractBackend, key: str
) -> None:
    """The docs' own example gives only max_held: the entry then assumes the default ttl
    (15 min), and a lock taken with ttl=30 was said "last refreshed 14 min 35 s ago"
    after being held 5 s."""
    plant = active_backend.plant
    assert plant is not None
    plant(storage_key(key), new_token(), timedelta(seconds=5), timedelta(seconds=25))
    locks = active_backend.backend.list()

    # An entry that gives only max_held judges no refresh it cannot count.
    assert health.lease_findings(locks, health.limits({key: {"max_held": 600}})) == []
    # One that gives a ttl longer than the lock's says so.
    longer = {key: {"max_held": 600, "ttl": 900}}
    [found] = health.lease_findings(locks, health.limits(longer))
    assert found.kind == health.TTL_NOT_THE_LOCKS
    assert re.fullmatch(
        rf"'{key}' has 2\d\.\d s of its lease left after being held for \d\.\d s: its ttl is "
        rf"shorter than the 15 min 00 s that TASKLOCK_HEALTH\['{key}'\] gives, so its "
        "refreshes cannot be judged by that entry.",
        found.describe(),
    )
    with override_settings(TASKLOCK_HEALTH=longer):
        [message] = [m for m in check_lock_health() if key in m.msg]
    assert message.id == "django_tasklock.W015"
    assert '"ttl": 60' in str(message.hint)
    # Given the lock's ttl, the entry judges it: refreshed 5 s ago is on time.
    fitting = {key: {"max_held": 600, "ttl": 30}}
    assert health.lease_findings(locks, health.limits(fitting)) == []


def test_a_late_refresh_judged_by_the_default_ttl_says_it_assumed_it(
    active_backend: ContractBackend, key: str
) -> None:
    plant = active_backend.plant
    assert plant is not None
    # Held 30 min with 2 min left: by the default ttl (15 min), refreshed 13 min ago.
    plant(storage_key(key), new_token(), timedelta(minutes=30), timedelta(minutes=2))
    [found] = health.lease_findings(
        active_backend.backend.list(), health.limits({key: {"max_held": 3600}})
    )
    assert found.kind == health.REFRESH_OVERDUE
    assert re.match(
        rf"'{key}' has (2 min 00|1 min 59) s of its lease left; with the default ttl, which "
        rf"TASKLOCK_HEALTH\['{key}'\] assumes for want of one \(15 min 00 s\), it was last "
        "refreshed 13 min",
        found.describe(),
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


def test_a_holder_whose_process_is_gone_is_reported_by_key_whatever_the_entries(
    active_backend: ContractBackend, key: str
) -> None:
    from django_tasklock.processes import this_machine
    from django_tasklock.testing.cases_dead import dead_token

    if this_machine() is None:
        pytest.skip("no /proc here: no holder can be proven gone")
    backend = active_backend.backend
    assert backend.acquire(
        f"{key}-dead", dead_token(), ttl=timedelta(minutes=15), max_lifetime=LIFE
    )
    assert backend.acquire(
        f"{key}-live", new_token(), ttl=timedelta(minutes=15), max_lifetime=LIFE
    )
    with override_settings(TASKLOCK_HEALTH={"unrelated:*": 60}):
        messages = check_lock_health()
    assert [(m.id, m.msg.split()[0]) for m in messages] == [
        ("django_tasklock.W016", f"'{key}-dead'")
    ]
    assert "whose process is gone" in messages[0].msg
    assert messages[0].hint


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


def test_an_invalid_setting_is_left_to_e010_by_the_deploy_check() -> None:
    with override_settings(TASKLOCK_HEALTH={"": 60}):
        assert check_lock_health() == []
        assert [m.id for m in check_health_setting()] == ["django_tasklock.E010"]


def test_a_unique_claim_waiting_in_the_queue_is_not_behind_until_a_worker_takes_it(
    any_backend: ContractBackend, key: str
) -> None:
    # Nobody refreshes a claim before a worker runs its task: a backlog is no
    # stalled heartbeat. Taken over (the worker's first refresh), it is judged.
    backend = any_backend.backend
    entries = health.limits({f"{key}-*": {"ttl": 20, "refresh_interval": 1}})
    queued, taken = f"{key}-queued", f"{key}-taken"
    claims = {name: claim(name, ttl=20, backend=backend) for name in (queued, taken)}
    time.sleep(0.5)  # in the queue
    assert backend.refresh(taken, claims[taken], ttl=timedelta(seconds=20), max_lifetime=LIFE)
    time.sleep(2.5)  # more than two refresh intervals since the enqueue and the takeover
    found = health.lease_findings(backend.list(), entries)
    assert [(f.kind, f.key) for f in found] == [(health.REFRESH_OVERDUE, taken)]
    [held] = [lock for lock in backend.list() if lock.key == queued]
    assert held.holder.claim
    for name, token in claims.items():
        unclaim(name, token, backend=backend)


# -- permits (limit=N): one key, several leases -------------------------------------


def test_permits_are_judged_by_their_keys_entry_each_named(
    active_backend: ContractBackend, key: str
) -> None:
    backend = active_backend.backend
    assert backend.capabilities.permits  # every backend gives permits
    for _ in range(2):
        taken = backend.acquire_permit(
            key, new_token(), limit=3, ttl=timedelta(minutes=15), max_lifetime=LIFE
        )
        assert taken is not None
    assert backend.acquire(
        f"{key}-mutex", new_token(), ttl=timedelta(minutes=15), max_lifetime=LIFE
    )
    time.sleep(0.05)
    # The key's own name, as written: its permits' stored names do not match it.
    setting = {key: 0.01, f"{key}-mutex": 0.01}

    found = health.lease_findings(backend.list(), health.limits(setting))

    assert [(f.kind, f.key, f.permit) for f in found] == [
        (health.HELD_TOO_LONG, key, 0),
        (health.HELD_TOO_LONG, key, 1),
        (health.HELD_TOO_LONG, f"{key}-mutex", None),
    ]
    assert found[1].describe().startswith(f"permit 1 of {key!r} has been held for ")
    assert (
        found[1]
        .describe(key=False)
        .startswith(f"A permit of a lock matching {key!r} has been held for ")
    )
    assert found[2].describe().startswith(f"'{key}-mutex' has been held for ")
    # One key held too long, not two locks: merged, the longest held speaks for both.
    [permits, mutex] = health.merged(found)
    assert (permits.permits, permits.permit, permits.seconds) == ((0, 1), None, found[0].seconds)
    assert permits.describe().startswith(
        f"Of permits 0, 1 of {key!r}, the longest held has been held for "
    )
    assert permits.describe(key=False).startswith(
        f"Of 2 permits of a lock matching {key!r}, the longest held has been held for "
    )
    assert mutex == found[2]
    # The deploy check names each permit (no separator, raw or escaped).
    with override_settings(TASKLOCK_HEALTH=setting):
        messages = [m.msg for m in check_lock_health() if key in m.msg]
    assert [m.split(" has ")[0] for m in messages] == [
        f"permit 0 of {key!r}",
        f"permit 1 of {key!r}",
        f"'{key}-mutex'",
    ]
    assert not any("\x1f" in m or "\\x1f" in m for m in messages)


def test_merged_keeps_each_holder_gone_and_each_mutex_apart() -> None:
    def finding(kind: str, key: str, permit: int | None, seconds: float) -> health.Finding:
        return health.Finding(kind, seconds, 60.0, key, "k*", permit=permit, holder="h:1")

    found = [
        finding(health.HELD_TOO_LONG, "k1", 2, 100.0),
        finding(health.HOLDER_GONE, "k1", 0, 90.0),
        finding(health.HELD_TOO_LONG, "k2", None, 80.0),
        finding(health.HELD_TOO_LONG, "k1", 0, 300.0),
        finding(health.HOLDER_GONE, "k1", 1, 70.0),
        finding(health.REFRESH_OVERDUE, "k1", 1, 200.0),
        finding(health.HELD_TOO_LONG, "k2", None, 80.0),
    ]

    assert [(f.kind, f.key, f.permit, f.permits, f.seconds) for f in health.merged(found)] == [
        (health.HELD_TOO_LONG, "k1", None, (0, 2), 300.0),  # the longest held of both
        (health.HOLDER_GONE, "k1", 0, (), 90.0),
        (health.HELD_TOO_LONG, "k2", None, (), 80.0),
        (health.HOLDER_GONE, "k1", 1, (), 70.0),
        (health.REFRESH_OVERDUE, "k1", 1, (), 200.0),  # alone of its kind: as found
        (health.HELD_TOO_LONG, "k2", None, (), 80.0),
    ]
