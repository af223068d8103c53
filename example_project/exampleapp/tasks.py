"""Ordinary calling code: a job that must not run on two workers at once.

Call ``rebuild_rollups()`` from cron on every node, from a Celery beat task,
from a management command: whichever worker gets there first rebuilds, the
others skip. Nothing here knows which backend keeps the lock.
"""

from __future__ import annotations

import logging
import time

from django_tasklock import LockResult, TaskLockService, run_exclusive

logger = logging.getLogger(__name__)

ROLLUPS_KEY = "rebuild-rollups"


def rebuild_rollups(*, ttl: float = 60.0, work_seconds: float = 2.0) -> LockResult[int]:
    """Rebuild the analytics rollups, unless another worker is already doing it.

    ``result.acquired`` says whether this call did the work; ``result.result``
    is then the number of rollup rows written.
    """
    return run_exclusive(
        ROLLUPS_KEY,
        lambda: _rebuild(work_seconds),
        ttl=ttl,
        on_locked=_skip,
    )


def _rebuild(work_seconds: float) -> int:
    steps = 4
    logger.info("acquired %r: rebuilding rollups...", ROLLUPS_KEY)
    for step in range(1, steps + 1):
        time.sleep(work_seconds / steps)  # stands in for the real queries
        logger.info("  rollups %d/%d done", step, steps)
    return 1234


def _skip() -> None:
    # Who holds it, for the log; the holder may have finished in the meantime.
    held = TaskLockService().peek(ROLLUPS_KEY)
    if held is None:
        logger.info("skipped: %r was held (and has just been released)", ROLLUPS_KEY)
    else:
        logger.info(
            "skipped: %r is held by %s (lease ends in %.1f s)",
            ROLLUPS_KEY,
            held.holder,
            held.seconds_left,
        )
