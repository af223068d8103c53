from __future__ import annotations

import os
import tempfile
from typing import Any

from tests import services

SECRET_KEY = "django-tasklock-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_tasklock",
]

_sqlite_file = os.path.join(tempfile.gettempdir(), f"django_tasklock_test_{os.getpid()}.sqlite3")
DATABASES: dict[str, Any] = {
    # A file, not :memory:, so that other processes share it.
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _sqlite_file,
        "TEST": {"NAME": _sqlite_file},
    },
}
POSTGRES_URL = services.service_url("postgres", services.POSTGRES_ENV)
if POSTGRES_URL:
    DATABASES["postgres"] = {
        **services.postgres_settings(POSTGRES_URL),
        # One test database per run, so that runs side by side (tox) don't collide.
        "TEST": {"NAME": f"test_tasklock_{os.getpid()}"},
    }

    PGBOUNCER = services.pgbouncer_settings(services.postgres_settings(POSTGRES_URL))
    if PGBOUNCER is not None:
        DATABASES["pgbouncer"] = PGBOUNCER

REDIS_URL = services.service_url("redis", services.REDIS_ENV)
CACHES: dict[str, Any] = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if REDIS_URL:
    CACHES["redis"] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL}

TASKLOCK_BACKEND = "database"
