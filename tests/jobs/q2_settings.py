"""Settings of the ``manage.py qcluster`` processes: django-q2's ORM broker on PostgreSQL.

The database is the test run's own PostgreSQL test database (named by the
test), which holds the schedules, the broker's queue, the results and the locks.
"""

from __future__ import annotations

import os

from tests.jobs.settings import *  # noqa: F403
from tests.jobs.settings import INSTALLED_APPS as BASE_APPS
from tests.support import services

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
    # A task whose worker died is delivered again once ``retry`` s have passed
    # (tests/frameworks/test_django_q2_redelivery.py shortens both).
    "timeout": int(os.environ.get("TASKLOCK_TEST_Q2_TIMEOUT", "90")),
    "retry": int(os.environ.get("TASKLOCK_TEST_Q2_RETRY", "120")),
    "max_attempts": int(os.environ.get("TASKLOCK_TEST_Q2_ATTEMPTS", "1")),
    "poll": 0.1,
    "guard_cycle": 0.1,
    # The cluster runs django-q2's scheduler every 30 s; the test runs it itself, when due.
    "scheduler": False,
    "catch_up": True,
    "save_limit": 0,
}
