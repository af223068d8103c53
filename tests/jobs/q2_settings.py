"""Settings of the ``manage.py qcluster`` processes: django-q2's ORM broker on PostgreSQL.

The database is the test run's own PostgreSQL test database (named by the
test), which holds the schedules, the broker's queue, the results and the locks.
"""

from __future__ import annotations

import os

from tests import services
from tests.jobs.settings import *  # noqa: F403
from tests.jobs.settings import INSTALLED_APPS as BASE_APPS

INSTALLED_APPS = [*BASE_APPS, "django_q"]
DATABASES = {
    "default": {
        **services.postgres_settings(os.environ[services.POSTGRES_ENV]),
        "NAME": os.environ["TASKLOCK_TEST_Q2_DATABASE"],
    }
}
Q_CLUSTER = {
    "name": "tasklock-tests",
    "orm": "default",
    "workers": 2,
    "recycle": 10_000,
    "timeout": 90,
    "retry": 120,
    "max_attempts": 1,
    "poll": 0.1,
    "guard_cycle": 0.1,
    # The cluster runs django-q2's scheduler every 30 s; the test runs it itself, when due.
    "scheduler": False,
    "catch_up": True,
    "save_limit": 0,
}
