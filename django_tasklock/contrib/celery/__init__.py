"""Celery: one active ``celery beat`` among many (:class:`LeaderScheduler`), and no
duplicate enqueues (:class:`UniqueTask`, ``unique_on=``).

``celery beat --scheduler django_tasklock.contrib.celery:LeaderScheduler`` (or
``beat_scheduler``) runs Celery's default scheduler, firing only while this beat
process holds the leadership; ``django_tasklock.contrib.celery:LeaderDatabaseScheduler``
does the same for django-celery-beat's ``DatabaseScheduler``. See docs/scheduler-leader.md.
"""

from __future__ import annotations

from typing import Any

from django_tasklock.contrib import require

require("celery")

from django_tasklock.contrib.celery.beat import LeaderMixin, LeaderScheduler  # noqa: E402
from django_tasklock.contrib.celery.unique import UniqueTask  # noqa: E402

__all__ = ["LeaderDatabaseScheduler", "LeaderMixin", "LeaderScheduler", "UniqueTask"]


def __getattr__(name: str) -> Any:
    # Imported on first use only: it needs django-celery-beat, which the other names do not.
    if name == "LeaderDatabaseScheduler":
        from django_tasklock.contrib.celery.database import LeaderDatabaseScheduler

        return LeaderDatabaseScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
