"""django-celery-beat's ``DatabaseScheduler``, firing only while this beat process leads."""

from __future__ import annotations

from django_celery_beat.schedulers import DatabaseScheduler

from django_tasklock.contrib.celery.beat import LeaderMixin


class LeaderDatabaseScheduler(LeaderMixin, DatabaseScheduler):  # type: ignore[misc]
    """``DatabaseScheduler`` (schedules in the Django admin) with one active beat.

    A standby reads and writes no schedule row; on taking over, the new leader
    moves every entry's ``last_run_at`` to now and saves it at its next sync.
    """
