"""django_tasklock.contrib.health_check in a real django-health-check view and command."""

from __future__ import annotations

import importlib
import importlib.util
import io
import re
import time
from datetime import timedelta

import pytest
from django.test import Client, override_settings

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import storage_key
from django_tasklock.contrib import MissingFramework
from django_tasklock.testing import ContractBackend
from django_tasklock.testing.support import wait_until

#: django-health-check 4 (the plugin API this check is written for) needs Django 5.2;
#: on Django 4.2 pip installs 3.x, and importing the check says what to install.
HAS_V4 = importlib.util.find_spec("health_check.base") is not None
needs_v4 = pytest.mark.skipif(not HAS_V4, reason="django-health-check 4 needs Django 5.2+")
NAME = "TaskLocks(show_keys=False)"

# An earlier test's slow tick or unreachable storage in this process (W012, W014)
# would be this test's finding.
pytestmark = pytest.mark.usefixtures("no_ticks")


def _get(path: str) -> tuple[int, dict[str, str]]:
    response = Client().get(path, {"format": "json"})
    return response.status_code, response.json()


def _plant(backend: ContractBackend, key: str, held: timedelta) -> None:
    assert backend.plant is not None
    backend.plant(storage_key(key), new_token(), held, timedelta(minutes=10))


@pytest.fixture(autouse=True)
def heartbeat_not_behind() -> None:
    """The checks also judge this process's heartbeat, which other tests' leases share:
    wait until its latest tick is not behind (a tox run at full load failed on a
    0.1 s lease of another test whose refresh had run 0.7 s)."""
    from django_tasklock.ops import health

    wait_until(lambda: health.heartbeat_findings() == [], timeout=30)


@needs_v4
@override_settings(ROOT_URLCONF="tests.health_urls")
def test_healthy_locks_are_ok(active_backend: ContractBackend, key: str) -> None:
    _plant(active_backend, key, timedelta(minutes=1))
    with override_settings(TASKLOCK_HEALTH={f"{key}*": timedelta(hours=1)}):
        assert _get("/ht/") == (200, {NAME: "OK"})


@needs_v4
@override_settings(ROOT_URLCONF="tests.health_urls")
def test_a_lock_held_too_long_fails_the_view_naming_its_pattern(
    active_backend: ContractBackend, key: str
) -> None:
    _plant(active_backend, key, timedelta(hours=2, minutes=3, seconds=30))
    with override_settings(TASKLOCK_HEALTH={f"{key}*": timedelta(hours=1)}):
        status, body = _get("/ht/")
        assert status == 500
        assert body == {
            NAME: f"Warning: A lock matching '{key}*' has been held for 2 h 03 min, longer "
            f"than the 1 h 00 min that TASKLOCK_HEALTH['{key}*'] allows."
        }
        status, body = _get("/ht/keys/")  # show_keys=True
    assert status == 500
    assert body["TaskLocks(show_keys=True)"].startswith(f"Warning: '{key}' has been held for")


@needs_v4
@override_settings(ROOT_URLCONF="tests.health_urls")
def test_a_lock_whose_holder_process_is_gone_is_a_warning(
    active_backend: ContractBackend, key: str
) -> None:
    from django_tasklock.processes import this_machine
    from django_tasklock.testing.cases_dead import dead_token

    if this_machine() is None:
        pytest.skip("no /proc here: no holder can be proven gone")
    assert active_backend.plant is not None
    active_backend.plant(
        storage_key(key), dead_token(), timedelta(minutes=2), timedelta(minutes=10)
    )
    with override_settings(TASKLOCK_HEALTH={f"{key}*": timedelta(hours=1)}):
        status, body = _get("/ht/")
    assert status == 500
    assert body[NAME].startswith("Warning: A lock is held by ")
    assert "whose process is gone (held for 2 min 00 s)" in body[NAME]


@needs_v4
@override_settings(
    ROOT_URLCONF="tests.health_urls",
    TASKLOCK_BACKEND="redis",
    TASKLOCK_REDIS_URL="redis://127.0.0.1:1/0",
)
def test_without_the_setting_only_this_processs_heartbeat_is_judged() -> None:
    assert _get("/ht/") == (200, {NAME: "OK"})  # the storage, unreachable, is not read


@needs_v4
@override_settings(ROOT_URLCONF="tests.health_urls")
def test_an_unreadable_storage_is_unavailable_without_its_details() -> None:
    with override_settings(
        TASKLOCK_BACKEND="redis",
        TASKLOCK_REDIS_URL="redis://:secret@127.0.0.1:1/0",
        TASKLOCK_HEALTH={"*": 60},
    ):
        assert _get("/ht/") == (
            500,
            {NAME: "Unavailable: Could not list the task locks (ConnectionError)."},
        )


@needs_v4
@override_settings(ROOT_URLCONF="tests.health_urls", TASKLOCK_HEALTH={"a": {"max_hold": 1}})
def test_an_invalid_setting_is_unavailable_naming_it() -> None:
    status, body = _get("/ht/")
    assert status == 500
    assert body[NAME].startswith("Unavailable: TASKLOCK_HEALTH['a'] has unknown keys")


@needs_v4
@override_settings(ROOT_URLCONF="tests.health_urls")
def test_the_health_check_command_runs_it(active_backend: ContractBackend, key: str) -> None:
    from health_check.management.commands.health_check import Command

    _plant(active_backend, key, timedelta(hours=3))
    out = io.StringIO()
    with (
        override_settings(TASKLOCK_HEALTH={f"{key}*": 3600}),
        pytest.raises(SystemExit) as exit_info,
    ):
        Command(stdout=out).run_from_argv(
            ["manage.py", "health_check", "tasklock-health", "--no-http"]
        )
    assert exit_info.value.code == 1
    assert out.getvalue().startswith(f"{NAME}: Warning: A lock matching '{key}*' has been held")


@pytest.mark.skipif(HAS_V4, reason="django-health-check 3 only (Django 4.2)")
def test_with_django_health_check_3_importing_says_what_to_install() -> None:
    with pytest.raises(MissingFramework, match=r"needs django-health-check 4 or later"):
        importlib.import_module("django_tasklock.contrib.health_check")


@needs_v4
@override_settings(ROOT_URLCONF="tests.health_urls")
def test_a_limited_keys_permits_held_too_long_are_one_finding(
    active_backend: ContractBackend, key: str
) -> None:
    backend = active_backend.backend
    assert backend.capabilities.permits  # every backend gives permits
    for _ in range(3):
        taken = backend.acquire_permit(
            key, new_token(), limit=3, ttl=timedelta(minutes=15), max_lifetime=timedelta(hours=1)
        )
        assert taken is not None
    time.sleep(0.05)
    with override_settings(TASKLOCK_HEALTH={f"{key}*": 0.01}):
        status, body = _get("/ht/")
        assert status == 500
        assert re.fullmatch(
            rf"Warning: Of 3 permits of a lock matching '{key}\*', the longest held has been "
            rf"held for \d+\.\d s, longer than the 0\.0 s that TASKLOCK_HEALTH\['{key}\*'\] "
            r"allows\.",
            body[NAME],
        ), body
        status, body = _get("/ht/keys/")  # show_keys=True
    assert status == 500
    assert body["TaskLocks(show_keys=True)"].startswith(
        f"Warning: Of permits 0, 1, 2 of {key!r}, the longest held has been held for "
    )
