"""django-cron: a ``DJANGO_CRON_LOCK_BACKEND`` whose lock is a lease.

``DJANGO_CRON_LOCK_BACKEND = "django_tasklock.contrib.django_cron.TaskLock"``
and every job ``runcrons`` runs holds the key ``"django-cron:<code>"`` while
it runs: a lease kept alive by the heartbeat (however long ``do()`` takes, up
to ``max_lifetime``), freed by itself when a ``runcrons`` process dies, shown
by ``manage.py tasklock list`` and the admin page, shared by every host that
reaches the same storage. A job that finds its key held does not run:
``runcrons`` prints why (who holds it, until when) and tries at its next run,
as with django-cron's own backends.
"""

from __future__ import annotations

from django_tasklock.contrib import require

require("django_cron")

from collections.abc import Mapping  # noqa: E402
from contextvars import Token  # noqa: E402
from typing import Any  # noqa: E402

from django_cron.backends.lock.base import DjangoCronJobLock  # noqa: E402

from django_tasklock.api.service import lock  # noqa: E402
from django_tasklock.api.skipped import report_skipped  # noqa: E402
from django_tasklock.locking import loss  # noqa: E402
from django_tasklock.locking.lock import Lock  # noqa: E402
from django_tasklock.locking.options import check_lock_kwargs  # noqa: E402

__all__ = ["TaskLock"]

#: What each job's key starts with; the rest is the job's ``code``.
KEY_PREFIX = "django-cron:"


class TaskLock(DjangoCronJobLock):  # type: ignore[misc]  # django-cron is untyped
    """django-cron's lock backend, holding a lease on ``"django-cron:<code>"``.

    A job's lock options (``ttl``, ``refresh_interval``, ``max_lifetime``,
    ``wait``, ``min_hold``, ``fencing``, ``progress_timeout``) come from its
    class attribute ``TASKLOCK_OPTIONS`` (a dict), else ``TASKLOCK_DEFAULTS``.
    Bad ones are a ``TypeError`` or ``ValueError`` naming the option, which
    ``runcrons`` records as the job's failure; so is a storage that cannot be
    reached (never taken for "held"). ``ALLOW_PARALLEL_RUNS = True`` takes no
    lock, as with every django-cron backend. Telemetry names the lock by its
    key (a ``name`` option says otherwise). While ``do()`` runs,
    ``django_tasklock.current_lock()`` is the job's lock (``.lost``, ``.fence``).
    """

    def __init__(self, cron_class: type[Any], silent: bool, *args: Any, **kwargs: Any) -> None:
        super().__init__(cron_class, silent, *args, **kwargs)
        options = getattr(cron_class, "TASKLOCK_OPTIONS", None)
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise TypeError(
                f"{self.job_name}.TASKLOCK_OPTIONS must be a dict of lock options, "
                f"not {type(options).__name__}"
            )
        check_lock_kwargs(options)
        if "cancel_on_loss" in options:
            raise TypeError(
                f"{self.job_name}.TASKLOCK_OPTIONS: cancel_on_loss is for asyncio tasks, "
                "not cron jobs"
            )
        if "limit" in options:
            raise TypeError(
                f"{self.job_name}.TASKLOCK_OPTIONS: limit is not for cron jobs, each of "
                "which runs once at a time"
            )
        self.key = f"{KEY_PREFIX}{self.job_code}"
        # One key per job: telemetry names the lock by it (tasklock.name).
        self.task_lock: Lock = lock(self.key, **{"name": self.key, **options})
        self._context: Token[loss.Holding | None] | None = None

    def lock(self) -> bool:
        """Take the job's key: True, or False (logged, ``lock_skipped`` sent) when held."""
        if not self.task_lock.try_acquire():
            report_skipped(self.task_lock, self.job_name)
            return False
        self._context = loss.enter(self.task_lock, stop=False)
        return True

    def release(self) -> None:
        loss.leave(self._context)
        self._context = None
        self.task_lock.release()

    def lock_failed_message(self) -> str:
        try:
            held = self.task_lock.seen or self.task_lock.backend.peek(self.key)
        except Exception:  # the message is best effort; the job is skipped either way
            held = None
        if held is None:
            return f"{self.job_name}: task lock {self.key!r} was held. Will try later."
        return (
            f"{self.job_name}: task lock {self.key!r} is held by host {held.holder.host}, "
            f"pid {held.holder.pid if held.holder.pid is not None else '?'} "
            f"(until {held.expires_at.isoformat()}). Will try later."
        )
