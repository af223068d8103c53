"""APScheduler 3.x: one active scheduler among many (:class:`LeaderExecutor`).

Wrap a scheduler's executors in :class:`LeaderExecutor`, sharing one
:class:`~django_tasklock.api.leadership.Leadership`: every scheduler process keeps
computing its jobs' run times, but only the leader's executor runs them, and
only runs due from the instant its term began (the previous leader ran those
due before). See docs/scheduler-leader.md.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_tasklock.contrib import require

require("apscheduler")

from apscheduler.executors.base import BaseExecutor  # noqa: E402

from django_tasklock.api.leadership import Leadership  # noqa: E402

__all__ = ["LeaderExecutor"]


class LeaderExecutor(BaseExecutor):  # type: ignore[misc]
    """An APScheduler 3 executor that runs jobs only while this process leads.

    ``BackgroundScheduler(executors={"default": LeaderExecutor(ThreadPoolExecutor(),
    "nightly-scheduler")})``. ``leadership`` is a key (then ``options`` are
    :class:`~django_tasklock.api.leadership.Leadership`'s: ``ttl``, ``retry_interval``...)
    or a ``Leadership`` to share between several executors of one scheduler.
    The leadership is taken (in its own thread) when the scheduler starts the
    executor and let go at its shutdown.

    On a standby, run times are dropped here: the scheduler still moves each
    job to its next run time (and sends ``EVENT_JOB_SUBMITTED``), so that the
    standby is ready to take over, but nothing runs.
    """

    def __init__(self, executor: Any, leadership: Leadership | str, **options: Any) -> None:
        super().__init__()
        self.executor = executor
        self.leadership = (
            leadership if isinstance(leadership, Leadership) else Leadership(leadership, **options)
        )

    def start(self, scheduler: Any, alias: str) -> None:
        super().start(scheduler, alias)
        self.executor.start(scheduler, alias)
        self.leadership.start()

    def shutdown(self, wait: bool = True) -> None:
        try:
            self.executor.shutdown(wait)
        finally:
            self.leadership.stop()

    def submit_job(self, job: Any, run_times: list[datetime]) -> None:
        """Pass on the run times due since this term began; drop them all on a standby."""
        since = self.leadership.leader_since
        kept = [] if since is None else [when for when in run_times if when >= since]
        if not kept:
            self._logger.debug(
                "Not running job %s: %s (leadership %r).",
                job,
                "due before this term" if since is not None else "standby",
                self.leadership.key,
            )
            return
        self.executor.submit_job(job, kept)

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        self.executor._do_submit_job(job, run_times)  # pragma: no cover - submit_job delegates
