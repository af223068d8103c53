"""django-celery-beat's ``DatabaseScheduler``, firing only while this beat process leads.

Needs django-celery-beat, which no extra of django-tasklock's installs (see
``django_tasklock.contrib``): imported without it, this raises
:class:`~django_tasklock.contrib.MissingFramework` saying what to install.
"""

from __future__ import annotations

from django_tasklock.contrib import require

require("celery.database")

from django_celery_beat.schedulers import DatabaseScheduler  # noqa: E402

from django_tasklock.contrib.celery.beat import LeaderMixin  # noqa: E402


class LeaderDatabaseScheduler(LeaderMixin, DatabaseScheduler):  # type: ignore[misc]
    """``DatabaseScheduler`` (schedules in the Django admin) with one active beat.

    A standby reads and writes no schedule row; on taking over, the new leader
    moves every entry's ``last_run_at`` to now and saves it at its next sync.
    """
