"""Integrations behind optional extras: a clear error when the framework is missing."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_tasklock import contrib
from django_tasklock.contrib import (
    ALIASES,
    INTEGRATIONS,
    Integration,
    MissingFramework,
    require,
)
from django_tasklock.contrib.checks import check_integrations
from tests.conftest import runs_manage_py_check


@pytest.fixture
def absent_framework(monkeypatch: pytest.MonkeyPatch) -> str:
    """An integration whose framework is certainly not installed."""
    monkeypatch.setitem(
        INTEGRATIONS,
        "nosuchframework",
        Integration("tasklock_no_such_framework", "no-such-framework", "nosuch", versions=">=1"),
    )
    return "nosuchframework"


def test_require_names_the_framework_package(absent_framework: str) -> None:
    with pytest.raises(MissingFramework, match=r"pip install 'no-such-framework>=1'"):
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
        assert "pip install 'no-such-framework>=1'" in error.msg
        with pytest.raises(SystemCheckError, match=r"django_tasklock\.E020"):
            call_command("check")


def test_check_is_quiet_when_the_framework_is_there() -> None:
    with override_settings(SOME_FRAMEWORK_SETTING=["django_tasklock.contrib.celery.Leader"]):
        assert check_integrations() == []


def test_check_reads_no_secret_key() -> None:
    # Django refuses to give an empty SECRET_KEY (ImproperlyConfigured), which
    # `manage.py check` allows: the check crashed (tests/ops/test_manage_check.py).
    with override_settings(SECRET_KEY=""):
        assert check_integrations() == []


def test_check_reports_the_database_scheduler_without_django_celery_beat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        INTEGRATIONS,
        "celery.database",
        Integration("tasklock_no_celery_beat_here", "django-celery-beat"),
    )
    for scheduler in (
        "django_tasklock.contrib.celery:LeaderDatabaseScheduler",
        "django_tasklock.contrib.celery.LeaderDatabaseScheduler",
        "django_tasklock.contrib.celery.database:LeaderDatabaseScheduler",
    ):
        with override_settings(CELERY_BEAT_SCHEDULER=scheduler):
            (error,) = check_integrations()
        assert error.msg == (
            f"CELERY_BEAT_SCHEDULER names {scheduler}, but django_tasklock.contrib."
            "celery.database needs django-celery-beat, which is not installed: "
            "pip install django-celery-beat"
        )
    with override_settings(CELERY_BEAT_SCHEDULER="django_tasklock.contrib.celery:LeaderScheduler"):
        assert check_integrations() == []


CONTRIB = Path(contrib.__file__).parent
REQUIRED = re.compile(r'^require\("([\w.]+)"\)', re.MULTILINE)


def test_each_integration_is_the_one_its_module_requires() -> None:
    required = {
        name: path.relative_to(CONTRIB).as_posix()
        for path in CONTRIB.rglob("*.py")
        for name in REQUIRED.findall(path.read_text())
    }
    assert set(required) == set(INTEGRATIONS)
    for name, path in required.items():
        assert path in (f"{name.replace('.', '/')}.py", f"{name.replace('.', '/')}/__init__.py")
    for alias, name in ALIASES.items():
        package, _, attribute = alias.rpartition(".")
        assert attribute in importlib.import_module(f"django_tasklock.contrib.{package}").__all__
        assert name in INTEGRATIONS


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", line, maxsplit=1)[0].lower() for line in requirements}


def test_each_message_names_what_installs_the_framework() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with (CONTRIB.parent.parent / "pyproject.toml").open("rb") as file:
        extras = tomllib.load(file)["project"]["optional-dependencies"]
    ours = {extra: _requirement_names(reqs) for extra, reqs in extras.items()}
    for tooling in ("test", "dev", "bench", "docs"):
        del ours[tooling]
    for name, integration in INTEGRATIONS.items():
        distribution = integration.distribution.lower()
        if integration.extra is None:
            assert not [extra for extra, names in ours.items() if distribution in names], name
            assert integration.install == f"pip install {integration.distribution}"
        else:
            assert distribution in ours[integration.extra], name
            # The hint installs what the extra would, from PyPI, as pasted: never
            # django-tasklock itself, which is not on any index.
            requirement = f"{integration.distribution}{integration.versions}"
            assert requirement in extras[integration.extra], name
            assert integration.install == f"pip install '{requirement}'"
        assert "django-tasklock" not in integration.install
