"""System checks: wired into manage.py check, with ids and hints."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_tasklock.checks import check_tasklock_settings


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_default_configuration_is_clean() -> None:
    assert check_tasklock_settings() == []


def test_unknown_backend_fails_manage_py_check() -> None:
    with override_settings(TASKLOCK_BACKEND="nosuch"), pytest.raises(SystemCheckError) as info:
        call_command("check")
    assert "django_tasklock.E001" in str(info.value)
    assert "HINT" in str(info.value)


@pytest.mark.parametrize("backend", ["nosuch", "no.such.Backend", "django_tasklock.conf.Settings"])
def test_bad_backend_names_are_e001(backend: str) -> None:
    with override_settings(TASKLOCK_BACKEND=backend):
        messages = check_tasklock_settings()
    assert ids(messages) == ["django_tasklock.E001"]
    assert messages[0].hint


def test_unknown_database_alias_is_e006() -> None:
    with override_settings(TASKLOCK_DATABASE="nope"):
        assert ids(check_tasklock_settings()) == ["django_tasklock.E006"]


def test_database_backend_without_the_app_is_e005() -> None:
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes"]):
        assert "django_tasklock.E005" in ids(check_tasklock_settings())


@pytest.mark.parametrize(
    "defaults",
    [{"ttl": -1}, {"ttl": 10, "refresh_interval": 20}, {"max_lifetime": 10**6}, {"tll": 5}],
)
def test_bad_defaults_are_e007(defaults: dict[str, Any]) -> None:
    with override_settings(TASKLOCK_DEFAULTS=defaults):
        messages = check_tasklock_settings()
    assert ids(messages) == ["django_tasklock.E007"]


def test_redis_backend_with_a_missing_cache_alias_is_e003() -> None:
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_CACHE="absent"):
        assert ids(check_tasklock_settings()) == ["django_tasklock.E003"]


def test_redis_backend_on_a_cache_that_is_not_django_redis_is_e004() -> None:
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_CACHE="default"):
        assert ids(check_tasklock_settings()) == ["django_tasklock.E004"]


def test_redis_url_needs_no_cache() -> None:
    with override_settings(
        TASKLOCK_BACKEND="redis",
        TASKLOCK_REDIS_CACHE="absent",
        TASKLOCK_REDIS_URL="redis://127.0.0.1:6379/15",
    ):
        assert check_tasklock_settings() == []


@pytest.fixture
def atomic_requests_on_sqlite(monkeypatch: pytest.MonkeyPatch) -> None:
    """ATOMIC_REQUESTS on for the SQLite ``default`` database, as Django reads it per request."""
    from django.db import connections

    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)


@pytest.mark.usefixtures("atomic_requests_on_sqlite")
def test_atomic_requests_on_the_sqlite_lock_database_is_w001() -> None:
    messages = check_tasklock_settings()
    assert ids(messages) == ["django_tasklock.W001"]
    assert "ATOMIC_REQUESTS" in messages[0].msg
    assert "@transaction.non_atomic_requests" in str(messages[0].hint)


@pytest.mark.usefixtures("atomic_requests_on_sqlite")
def test_w001_is_reported_by_manage_py_check(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("check")  # a warning does not fail the command
    assert "django_tasklock.W001" in capsys.readouterr().err


@pytest.mark.usefixtures("atomic_requests_on_sqlite")
def test_atomic_requests_matter_only_on_the_database_backend() -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        assert check_tasklock_settings() == []


def test_the_app_registers_its_checks_when_ready() -> None:
    from django.core.checks.registry import registry

    assert check_tasklock_settings in list(registry.get_checks())  # type: ignore[comparison-overlap]
