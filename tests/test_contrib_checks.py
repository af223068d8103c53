"""Integrations behind optional extras: a clear error when the framework is missing."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_tasklock.contrib import INTEGRATIONS, Integration, MissingFramework, require
from django_tasklock.contrib.checks import check_integrations
from tests.conftest import runs_manage_py_check


@pytest.fixture
def absent_framework(monkeypatch: pytest.MonkeyPatch) -> str:
    """An integration whose framework is certainly not installed."""
    monkeypatch.setitem(
        INTEGRATIONS,
        "nosuchframework",
        Integration("tasklock_no_such_framework", "no-such-framework", "nosuch"),
    )
    return "nosuchframework"


def test_require_names_the_extra(absent_framework: str) -> None:
    with pytest.raises(MissingFramework, match=r"pip install 'django-tasklock\[nosuch\]'"):
        require(absent_framework)


def test_require_passes_when_installed() -> None:
    require("celery")  # the test extra installs Celery


@runs_manage_py_check
def test_check_reports_a_setting_naming_a_missing_integration(absent_framework: str) -> None:
    with override_settings(
        SOME_FRAMEWORK_SETTING={"backend": "django_tasklock.contrib.nosuchframework.Lock"}
    ):
        (error,) = check_integrations()
        assert error.id == "django_tasklock.E020"
        assert "SOME_FRAMEWORK_SETTING" in error.msg
        assert "django-tasklock[nosuch]" in error.msg
        with pytest.raises(SystemCheckError, match=r"django_tasklock\.E020"):
            call_command("check")


def test_check_is_quiet_when_the_framework_is_there() -> None:
    with override_settings(SOME_FRAMEWORK_SETTING=["django_tasklock.contrib.celery.Leader"]):
        assert check_integrations() == []


def test_check_reads_no_secret_key() -> None:
    # Django refuses to give an empty SECRET_KEY (ImproperlyConfigured), which
    # `manage.py check` allows: the check crashed (tests/test_manage_check.py).
    with override_settings(SECRET_KEY=""):
        assert check_integrations() == []
