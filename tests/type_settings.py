"""The settings mypy's django-stubs plugin loads (``pyproject.toml``): the apps, no service.

``tests.settings`` builds on these and adds the services: databases, caches and a
PgBouncer it starts for the run, stopped by an exit handler. mypy ends its
process with ``os._exit``, so no exit handler runs there: loading
``tests.settings`` left a PgBouncer behind after every type check with
PostgreSQL configured.
"""

from __future__ import annotations

from tests import jobs

SECRET_KEY = "django-tasklock-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_tasklock",
    *jobs.TASK_APPS,
]

# The services' URLs the tests read from the settings: tests.settings finds them.
POSTGRES_URL: str | None = None
MARIADB_URL: str | None = None
REDIS_URL: str | None = None
