"""System checks: wired into manage.py check, with ids and hints."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_tasklock.checks import check_tasklock_settings
from tests.conftest import runs_manage_py_check


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_default_configuration_is_clean() -> None:
    assert check_tasklock_settings() == []


@runs_manage_py_check
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


def test_database_backend_without_the_app_raises_at_first_use_naming_installed_apps() -> None:
    # No check reports this: without the app, nothing registers the checks.
    from django.core.exceptions import ImproperlyConfigured

    from django_tasklock import run_exclusive

    with (
        override_settings(INSTALLED_APPS=["django.contrib.contenttypes"]),
        pytest.raises(ImproperlyConfigured, match="INSTALLED_APPS"),
    ):
        run_exclusive("no-app", lambda: None)


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


@runs_manage_py_check
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


def test_postgres_alias_on_sqlite_is_e008_and_refused_at_first_use() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from django_tasklock.backends import get_backend

    with override_settings(TASKLOCK_BACKEND="postgres"):
        messages = check_tasklock_settings()
        with pytest.raises(ImproperlyConfigured, match="is sqlite, not PostgreSQL"):
            get_backend()
    assert ids(messages) == ["django_tasklock.E008"]
    assert 'TASKLOCK_BACKEND = "database"' in str(messages[0].hint)


def test_postgres_alias_on_postgresql_is_the_database_backend() -> None:
    from django.conf import settings

    from django_tasklock.backends import get_backend
    from django_tasklock.backends.database.postgres import PostgresBackend
    from tests.conftest import require_service

    require_service("postgres")
    assert "postgres" in settings.DATABASES
    with override_settings(TASKLOCK_BACKEND="postgres", TASKLOCK_DATABASE="postgres"):
        assert check_tasklock_settings() == []
        backend = get_backend()
    assert isinstance(backend, PostgresBackend)
    assert backend.using == "postgres"


@pytest.mark.parametrize("blocked", [("redis",), ("django_redis",)])
def test_redis_backend_without_the_extra_is_e002(
    monkeypatch: pytest.MonkeyPatch, blocked: tuple[str, ...]
) -> None:
    import sys

    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_CACHE="absent"):
        messages = check_tasklock_settings()
    assert ids(messages) == ["django_tasklock.E002", "django_tasklock.E003"]
    hint = str(messages[0].hint)
    # What installs from anywhere: not the unpublished extra, not a path into a clone.
    assert "[redis]" not in hint
    expected = {"redis": "pip install redis", "django_redis": "pip install django-redis"}
    assert expected[blocked[0]] in hint
    assert "django-redis" in hint  # what shares a cache's connection pool


def test_redis_url_without_redis_py_is_e002_and_refused_at_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from django.core.exceptions import ImproperlyConfigured

    from django_tasklock.backends.redis import RedisBackend

    monkeypatch.setitem(sys.modules, "redis", None)
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL="redis://x:1/0"):
        messages = check_tasklock_settings()
    assert ids(messages) == ["django_tasklock.E002"]
    assert "pip install redis" in str(messages[0].hint)
    with pytest.raises(ImproperlyConfigured, match=r"pip install redis\b") as info:
        RedisBackend(url="redis://x:1/0").peek("key")
    assert "[redis]" not in str(info.value)


@pytest.mark.django_db(transaction=True)
def test_missing_table_says_to_migrate(tmp_path: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections

    from django_tasklock.backends.database import DatabaseBackend
    from django_tasklock.backends.database.connections import add_thread_connection

    unmigrated = {**connections["default"].settings_dict, "NAME": str(tmp_path / "new.sqlite3")}
    add_thread_connection("unmigrated", unmigrated)
    backend = DatabaseBackend(using="unmigrated")
    try:
        with pytest.raises(
            ImproperlyConfigured,
            match=r"run `python manage\.py migrate django_tasklock --database unmigrated`",
        ):
            backend.acquire(
                "k", "host:1:secret", ttl=timedelta(seconds=5), max_lifetime=timedelta(seconds=5)
            )
        with pytest.raises(ImproperlyConfigured, match="cache_entries table"):
            backend.list()
    finally:
        connections["unmigrated"].close()
