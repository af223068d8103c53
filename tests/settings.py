from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

from tests import jobs
from tests.support import services
from tests.type_settings import *  # noqa: F403 (the apps; what follows adds the services)

TASKS = jobs.TASKS
# django-tasks-db's tables come from its models, not its migrations: on MariaDB, the
# migrations of 0.12 (its last release for Django 4.2) rename an index that MariaDB
# never created (a partial index on expressions, which it does not support).
MIGRATION_MODULES = {"django_tasks_database": None}
ROOT_URLCONF = "tests.urls"

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

MARIADB_URL = services.service_url("mariadb", services.MARIADB_ENV)
if MARIADB_URL:
    DATABASES["mariadb"] = {
        **services.mariadb_settings(MARIADB_URL),
        "TEST": {"NAME": f"test_tasklock_{os.getpid()}"},
    }

REDIS_URL = services.service_url("redis", services.REDIS_ENV)
CACHES: dict[str, Any] = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if REDIS_URL:
    CACHES["redis"] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL}

TASKLOCK_BACKEND = "database"

# Tests log users in (the admin page, in a browser too): a fast hasher, so that a
# login is not seconds of PBKDF2 on a loaded machine (a browser test's 10 s wait
# for the logged-in page ran out in a CI run).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Huey (tests/frameworks/test_huey.py): the queue the test enqueues on, its own on the shared
# Redis server; the run_huey consumers are told its name. Nothing connects until then.
HUEY = {
    "name": f"tasklock-tests-{os.getpid()}-{uuid.uuid4().hex[:8]}",
    "url": REDIS_URL,
    "immediate": False,
    "results": True,
}

# django-rq's @job (docs/rq.md's example, run by tests/docs/test_readme.py) reads its
# queues from here; tests/frameworks/test_rq.py's workers use queues of their own.
RQ_QUEUES = {"default": {"URL": REDIS_URL or "redis://127.0.0.1:6379/15"}}

# The admin page of held locks (tests/ops/test_admin.py, tests/ops/test_admin_browser.py).
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
