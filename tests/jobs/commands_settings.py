"""Settings of ``manage.py hold_lock``: the locks in the test's SQLite file, or where
``TASKLOCK_TEST_LOCK_STORE`` says (``tests.jobs.lock_settings``)."""

from __future__ import annotations

import os

if os.environ.get("TASKLOCK_TEST_LOCK_STORE"):
    from tests.jobs.lock_settings import *  # noqa: F403
else:
    from tests.jobs.settings import *  # noqa: F403
from tests.jobs.settings import INSTALLED_APPS as BASE_APPS

INSTALLED_APPS = [*BASE_APPS, "tests.jobs.commands_app"]
