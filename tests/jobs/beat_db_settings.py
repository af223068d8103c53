"""Settings of ``tests.jobs.beat_database``: django-celery-beat, a SQLite file of its own."""

from __future__ import annotations

import os

SECRET_KEY = "django-tasklock-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_tasklock",
    "django_celery_beat",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["TASKLOCK_TEST_SQLITE"],
    }
}
TASKLOCK_BACKEND = "database"
