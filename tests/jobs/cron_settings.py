"""Settings of the ``runcrons`` processes: the workers' settings, plus django-cron.

``DJANGO_CRON_LOCK_BACKEND`` is the one line a project adds.
"""

from __future__ import annotations

from tests.jobs.settings import *  # noqa: F403
from tests.jobs.settings import INSTALLED_APPS as WORKER_APPS

INSTALLED_APPS = [*WORKER_APPS, "django_cron"]
DJANGO_CRON_LOCK_BACKEND = "django_tasklock.contrib.django_cron.TaskLock"
