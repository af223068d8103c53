"""Settings of the worker processes: the test's SQLite database file, given by the test."""

from __future__ import annotations

import os

from tests.jobs import TASK_APPS
from tests.jobs import TASKS as TASKS

SECRET_KEY = "django-tasklock-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_tasklock",
    *TASK_APPS,
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["TASKLOCK_TEST_SQLITE"],
        # Several workers and the test write this one file.
        "OPTIONS": {"timeout": 30},
    }
}
TASKLOCK_BACKEND = "database"
