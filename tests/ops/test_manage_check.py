"""Every system check the docs list, triggered as a user would: ``manage.py check``.

Each test writes a small settings module to ``tmp_path`` and runs Django in a
fresh process, so that nothing the test process already imported (redis-py,
the app's checks) hides what a new project sees. Missing packages are
simulated with an import blocker installed before Django starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import django
import pytest
from django.conf import settings

from tests.conftest import require_service
from tests.support import services

ROOT = Path(__file__).resolve().parents[2]

_BASE_SETTINGS = """
SECRET_KEY = "check-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_tasklock"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {db!r}}}}}
"""

# Makes ``import <name>`` fail as if the package were not installed.
_BLOCKER = """
import sys

class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Blocker())
"""

_MANAGE = """
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", *sys.argv[1:]])
"""


def run_django(
    tmp_path: Path,
    extra_settings: str = "",
    *args: str,
    code: str = _MANAGE,
    blocked: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (by default ``manage.py <args>``) under a fresh settings module."""
    (tmp_path / "check_settings.py").write_text(
        _BASE_SETTINGS.format(db=str(tmp_path / "db.sqlite3")) + textwrap.dedent(extra_settings)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKLOCK_")}
    env["DJANGO_SETTINGS_MODULE"] = "check_settings"
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    script = _BLOCKER.format(blocked=set(blocked)) + code
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )


def check(tmp_path: Path, extra_settings: str, blocked: tuple[str, ...] = ()) -> str:
    """``manage.py check``'s output; it must fail."""
    done = run_django(tmp_path, extra_settings, "check", blocked=blocked)
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stderr


REDIS_URL = 'TASKLOCK_BACKEND = "redis"\nTASKLOCK_REDIS_URL = "redis://x:1/0"'
INSTALL_REDIS = "pip install redis"
INSTALL_DJANGO_REDIS = "pip install django-redis"


@pytest.mark.parametrize(
    ("extra_settings", "blocked", "error_ids", "hint"),
    [
        ('TASKLOCK_BACKEND = "nosuch"', (), {"E001"}, "Set TASKLOCK_BACKEND"),
        (REDIS_URL, ("redis",), {"E002"}, INSTALL_REDIS),
        # (With a django-redis cache in CACHES, Django's own cache check fails
        # first when django-redis is missing: no CACHES entry here.)
        (
            'TASKLOCK_BACKEND = "redis"',
            ("redis", "django_redis"),
            {"E002", "E004"},
            INSTALL_REDIS,
        ),
        ('TASKLOCK_BACKEND = "redis"', ("django_redis",), {"E002", "E004"}, INSTALL_DJANGO_REDIS),
        (
            'TASKLOCK_BACKEND = "redis"\nTASKLOCK_REDIS_CACHE = "absent"',
            (),
            {"E003"},
            "Add a django-redis cache",
        ),
        ('TASKLOCK_BACKEND = "redis"', (), {"E004"}, "django_redis.cache.RedisCache"),
        ('TASKLOCK_DATABASE = "nope"', (), {"E006"}, "Use one of: default"),
        ('TASKLOCK_DEFAULTS = {"ttl": -1}', (), {"E007"}, "TASKLOCK_DEFAULTS takes"),
        ('TASKLOCK_BACKEND = "postgres"', (), {"E008"}, 'TASKLOCK_BACKEND = "database"'),
        (
            'TASKLOCK_BACKEND = "redis"\nTASKLOCK_REDIS_URL = "127.0.0.1:6379"',
            (),
            {"E009"},
            "redis+sentinel://",
        ),
        (
            'CACHES = {"default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache",'
            ' "LOCATION": "cache_entries"}}',
            (),
            {"E012"},
            'CACHES[\'default\']["LOCATION"] = "django_cache"',
        ),
    ],
    ids=[
        "E001",
        "E002-url",
        "E002-cache",
        "E002-django-redis",
        "E003",
        "E004",
        "E006",
        "E007",
        "E008",
        "E009",
        "E012",
    ],
)
def test_manage_py_check_reports(
    tmp_path: Path, extra_settings: str, blocked: tuple[str, ...], error_ids: set[str], hint: str
) -> None:
    output = check(tmp_path, extra_settings, blocked)
    reported = {
        line.split("django_tasklock.")[1][:4]
        for line in output.splitlines()
        if "django_tasklock.E" in line
    }
    assert reported == error_ids, output
    assert "HINT" in output
    assert hint in output
    assert "[redis]" not in output  # the unpublished extra, or a path into a clone


def test_redis_without_the_extra_is_e002_not_e001(tmp_path: Path) -> None:
    # The mistake a new user makes: TASKLOCK_BACKEND = "redis" without [redis]
    # (the example project's settings: a URL, no cache).
    output = check(tmp_path, REDIS_URL, blocked=("redis", "django_redis"))
    assert "django_tasklock.E002" in output
    assert "django_tasklock.E001" not in output
    assert "could not be imported" not in output


def test_a_configured_project_checks_clean(tmp_path: Path) -> None:
    done = run_django(tmp_path, "", "check")
    assert done.returncode == 0, done.stderr
    assert "django_tasklock" not in done.stderr


_FIRST_USE = """
import django
from django.core.exceptions import ImproperlyConfigured
django.setup()
from django_tasklock import run_exclusive
try:
    run_exclusive("first-use", lambda: None)
except ImproperlyConfigured as exc:
    print("ImproperlyConfigured:", exc)
else:
    print("no error")
"""


def test_database_backend_without_the_app_says_installed_apps_at_first_use(
    tmp_path: Path,
) -> None:
    # No check can report this (without the app, nothing registers them).
    without_app = 'INSTALLED_APPS = ["django.contrib.contenttypes"]'
    assert run_django(tmp_path, without_app, "check").returncode == 0
    done = run_django(tmp_path, without_app, code=_FIRST_USE)
    assert "ImproperlyConfigured:" in done.stdout, done.stderr
    assert '"django_tasklock" in INSTALLED_APPS' in done.stdout


def test_postgres_alias_on_sqlite_refuses_at_first_use(tmp_path: Path) -> None:
    done = run_django(tmp_path, 'TASKLOCK_BACKEND = "postgres"', code=_FIRST_USE)
    assert "ImproperlyConfigured:" in done.stdout, done.stderr
    assert "is sqlite, not PostgreSQL" in done.stdout


def test_postgres_alias_on_postgresql_checks_clean(tmp_path: Path) -> None:
    require_service("postgres")
    pg = services.postgres_settings(str(settings.POSTGRES_URL))
    done = run_django(
        tmp_path, f'TASKLOCK_BACKEND = "postgres"\nDATABASES = {{"default": {pg!r}}}', "check"
    )
    assert done.returncode == 0, done.stderr


def test_missing_migration_on_sqlite_says_to_migrate(tmp_path: Path) -> None:
    done = run_django(tmp_path, "", code=_FIRST_USE)  # a fresh database, never migrated
    assert "ImproperlyConfigured:" in done.stdout, done.stderr
    assert "run `python manage.py migrate django_tasklock`" in done.stdout


def test_missing_migration_on_postgresql_says_to_migrate(tmp_path: Path) -> None:
    require_service("postgres")
    pg = services.postgres_settings(str(settings.POSTGRES_URL))
    # A schema that does not exist: no cache_entries table is visible.
    pg["OPTIONS"] = {**pg.get("OPTIONS", {}), "options": "-c search_path=tasklock_nowhere"}
    done = run_django(
        tmp_path,
        f'DATABASES = {{"default": {pg!r}, "locks": {pg!r}}}\nTASKLOCK_DATABASE = "locks"',
        code=_FIRST_USE,
    )
    assert "ImproperlyConfigured:" in done.stdout, done.stderr
    assert "run `python manage.py migrate django_tasklock --database locks`" in done.stdout


def test_a_project_without_secret_key_checks_clean(tmp_path: Path) -> None:
    # Django's check passes without SECRET_KEY (only --deploy warns); E020's
    # look for dotted paths read every setting, and Django refuses to give an
    # unset SECRET_KEY: ImproperlyConfigured, and check crashed.
    plain_django = "del SECRET_KEY\nINSTALLED_APPS = INSTALLED_APPS[:2]"  # without django_tasklock
    plain = run_django(tmp_path, plain_django, "check")
    assert plain.returncode == 0, plain.stderr
    for unset in ("del SECRET_KEY", 'SECRET_KEY = ""'):
        done = run_django(tmp_path, unset, "check")
        assert done.returncode == 0, done.stderr
        assert "ImproperlyConfigured" not in done.stderr


LEADER_DATABASE_SCHEDULER = "django_tasklock.contrib.celery:LeaderDatabaseScheduler"


@pytest.mark.parametrize(
    "scheduler",
    [LEADER_DATABASE_SCHEDULER, "django_tasklock.contrib.celery.database.LeaderDatabaseScheduler"],
)
def test_leader_database_scheduler_without_django_celery_beat_is_e020(
    tmp_path: Path, scheduler: str
) -> None:
    output = check(
        tmp_path, f"CELERY_BEAT_SCHEDULER = {scheduler!r}", blocked=("django_celery_beat",)
    )
    assert "django_tasklock.E020" in output
    assert f"CELERY_BEAT_SCHEDULER names {scheduler}" in output
    assert "needs django-celery-beat, which is not installed: pip install django-celery-beat" in (
        output
    )
    assert "django-tasklock[" not in output  # no extra installs it


_IMPORT = """
import django
django.setup()
try:
    from {module} import {name}
except ImportError as exc:
    print(type(exc).__name__, exc)
else:
    print("imported")
"""


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("django_tasklock.contrib.celery", "LeaderDatabaseScheduler"),
        ("django_tasklock.contrib.celery.database", "LeaderDatabaseScheduler"),
    ],
)
def test_leader_database_scheduler_without_django_celery_beat_says_what_to_install(
    tmp_path: Path, module: str, name: str
) -> None:
    # Before: a raw ModuleNotFoundError for django_celery_beat.
    code = _IMPORT.format(module=module, name=name)
    done = run_django(tmp_path, "", code=code, blocked=("django_celery_beat",))
    expected = "MissingFramework django_tasklock.contrib.celery.database needs"
    assert done.stdout.startswith(expected), done.stdout + done.stderr
    assert done.stdout.rstrip().endswith(": pip install django-celery-beat")


def test_unique_on_for_django_tasks_needs_django_6_or_the_backport(tmp_path: Path) -> None:
    code = _IMPORT.format(module="django_tasklock.contrib.django_tasks", name="unique_on")
    done = run_django(tmp_path, "", code=code, blocked=("django_tasks",))
    if django.VERSION >= (6, 0):  # django.tasks is Django's own
        assert done.stdout == "imported\n", done.stdout + done.stderr
    else:
        assert done.stdout == (
            "MissingFramework django_tasklock.contrib.django_tasks needs django-tasks (the "
            "backport of django.tasks, which Django has from 6.0), which is not installed: "
            "pip install django-tasks\n"
        ), done.stdout + done.stderr
