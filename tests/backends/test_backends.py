"""Choosing the backend: setting, environment variable, dotted path, reset on change."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_tasklock import TaskLockService, run_exclusive
from django_tasklock.backends import get_backend, reset_backend
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.memory import MemoryBackend


def test_database_is_the_default_and_postgres_an_alias() -> None:
    assert isinstance(get_backend(), DatabaseBackend)
    with override_settings(TASKLOCK_BACKEND="postgres", TASKLOCK_DATABASE="other"):
        backend = get_backend()
        assert isinstance(backend, DatabaseBackend)
        assert backend.using == "other"


def test_setting_change_picks_a_new_backend() -> None:
    before = get_backend()
    assert get_backend() is before
    with override_settings(TASKLOCK_BACKEND="memory"):
        assert isinstance(get_backend(), MemoryBackend)
    assert isinstance(get_backend(), DatabaseBackend)


def test_environment_variable_decides_when_the_setting_is_absent(
    settings: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    del settings.TASKLOCK_BACKEND  # type: ignore[attr-defined]
    monkeypatch.setenv("TASKLOCK_BACKEND", "memory")
    reset_backend()
    assert isinstance(get_backend(), MemoryBackend)


def test_setting_wins_over_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKLOCK_BACKEND", "memory")
    assert isinstance(get_backend(), DatabaseBackend)


def test_dotted_path_to_a_backend_class() -> None:
    with override_settings(TASKLOCK_BACKEND="django_tasklock.backends.memory.MemoryBackend"):
        assert isinstance(get_backend(), MemoryBackend)


def test_unknown_backend_is_improperly_configured_at_first_use() -> None:
    with override_settings(TASKLOCK_BACKEND="nosuch"):
        service = TaskLockService()  # building a service reads nothing yet
        with pytest.raises(ImproperlyConfigured, match="nosuch"):
            service.run_exclusive("k", lambda: None)


def test_module_level_run_exclusive_uses_the_configured_backend() -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        backend = get_backend()
        result = run_exclusive("module-level", backend.list)
    assert result.acquired
    assert [held.key for held in result.result or []] == ["module-level"]


def test_importing_needs_no_settings() -> None:
    code = (
        "import django_tasklock, django_tasklock.backends.redis, "
        "django_tasklock.backends.memory, django_tasklock.backends.database; print('ok')"
    )
    env = {"TASKLOCK_BACKEND": "nosuch", "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr
