"""The settings mypy loads start no service.

mypy's django-stubs plugin imports the settings module ``pyproject.toml``
names, and mypy ends with ``os._exit``: a PgBouncer started there was never
stopped (one left behind by every type check with PostgreSQL configured).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from tests.support import services

ROOT = Path(__file__).resolve().parents[2]


def _type_check_settings() -> str:
    # A regular expression, not tomllib: Python 3.10 (tox's oldest) has none.
    found = re.search(
        r'^\[tool\.django-stubs\][^\[]*?^django_settings_module = "([\w.]+)"',
        (ROOT / "pyproject.toml").read_text(),
        re.MULTILINE | re.DOTALL,
    )
    assert found, "pyproject.toml names no [tool.django-stubs] django_settings_module"
    return found.group(1)


def test_the_type_check_settings_load_no_service_module() -> None:
    # As mypy runs it: not under a test (a test's process would reuse its PgBouncer).
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"PYTEST_CURRENT_TEST", services.PGBOUNCER_PORT_ENV}
    }
    probe = (
        f"import importlib, sys; importlib.import_module({_type_check_settings()!r}); "
        "print(sorted(name for name in sys.modules if name.startswith('tests.support')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_the_type_check_settings_have_the_test_apps() -> None:
    module = __import__(_type_check_settings(), fromlist=["INSTALLED_APPS"])
    assert module.INSTALLED_APPS == settings.INSTALLED_APPS
