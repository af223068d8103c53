"""Saying that work was skipped because its key was held: one INFO line and ``lock_skipped``.

A Celery task skipped by ``@exclusive`` returns None, as does one that ran
and returned None: without this, the two look the same in the worker's log.
The holder comes from the last look the failed acquisition took at the key
(a waiter's ``peek``), or else from one ``peek`` here, only on this path.
A ``limit=N`` key's holders are not read: all its permits were held.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django_tasklock.leases import observe
from django_tasklock.signals import lock_skipped

if TYPE_CHECKING:
    from django_tasklock.backends.base import HeldLock
    from django_tasklock.locking.lock import Lock

logger = logging.getLogger("django_tasklock")


#: ``lock_skipped``'s ``outcome`` when the call only did not run.
SKIPPED = "skipped"
#: ``lock_skipped``'s ``outcome`` when the call marked the key: its holder runs once more.
RERUN = "rerun"
#: ``lock_skipped``'s ``outcome`` when the task's framework retries it later.
RETRY = "retry"


def report_skipped(
    lock: Lock, what: str, outcome: str = SKIPPED, detail: str = ""
) -> HeldLock | None:
    """Log and signal that ``what`` (the work's name) did not run: ``lock``'s key was held.

    ``outcome`` (:data:`SKIPPED`, :data:`RERUN` or :data:`RETRY`) goes to
    the log line, to ``lock_skipped`` and to the observer; ``detail`` ends
    the log line (a sentence, with its leading space).

    Returns the lease seen holding the key, or None when its holder has let go
    since (or it could not be read). Never raises for the storage's sake: a
    ``peek`` that fails leaves the holder unknown (logged at DEBUG). A
    receiver's exception is logged, never raised, as for the other signals.
    """
    held = lock.seen
    if held is None and lock.limit == 1:
        try:
            held = lock.backend.peek(lock.key)
        except Exception:
            logger.debug("Reading the holder of %r failed.", lock.key, exc_info=True)
    _log(lock.key, what, held, lock.limit, outcome, detail)
    if observe.observer is not None:
        observe.observer.skipped(lock, outcome)
    for receiver, answer in lock_skipped.send_robust(
        sender=type(lock.backend),
        key=lock.key,
        holder=held.holder if held is not None else None,
        acquired_at=held.acquired_at if held is not None else None,
        expires_at=held.expires_at if held is not None else None,
        outcome=outcome,
    ):
        if isinstance(answer, Exception):
            logger.error(
                "A receiver of lock_skipped about %r failed: %r raised %r "
                "(traceback on the django.dispatch logger).",
                lock.key,
                receiver,
                answer,
            )
    return held


def _log(
    key: str, what: str, held: HeldLock | None, limit: int, outcome: str, detail: str
) -> None:
    then = " Marked: its holder runs it once more when done." if outcome == RERUN else ""
    then += detail
    if limit > 1:
        logger.info(
            "Skipped %s: all %s permits of task lock %r were held.%s", what, limit, key, then
        )
        return
    if held is None:
        logger.info(
            "Skipped %s: task lock %r was held (its holder has let go since).%s", what, key, then
        )
        return
    logger.info(
        "Skipped %s: task lock %r is held by host %s, pid %s (acquired at %s, expires at %s).%s",
        what,
        key,
        held.holder.host,
        held.holder.pid if held.holder.pid is not None else "?",
        held.acquired_at.isoformat(),
        held.expires_at.isoformat(),
        then,
    )
