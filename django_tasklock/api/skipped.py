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


def report_skipped(lock: Lock, what: str) -> HeldLock | None:
    """Log and signal that ``what`` (the work's name) did not run: ``lock``'s key was held.

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
    _log(lock.key, what, held, lock.limit)
    if observe.observer is not None:
        observe.observer.skipped(lock)
    for receiver, outcome in lock_skipped.send_robust(
        sender=type(lock.backend),
        key=lock.key,
        holder=held.holder if held is not None else None,
        acquired_at=held.acquired_at if held is not None else None,
        expires_at=held.expires_at if held is not None else None,
    ):
        if isinstance(outcome, Exception):
            logger.error(
                "A receiver of lock_skipped about %r failed: %r raised %r "
                "(traceback on the django.dispatch logger).",
                lock.key,
                receiver,
                outcome,
            )
    return held


def _log(key: str, what: str, held: HeldLock | None, limit: int) -> None:
    if limit > 1:
        logger.info("Skipped %s: all %s permits of task lock %r were held.", what, limit, key)
        return
    if held is None:
        logger.info("Skipped %s: task lock %r was held (its holder has let go since).", what, key)
        return
    logger.info(
        "Skipped %s: task lock %r is held by host %s, pid %s (acquired at %s, expires at %s).",
        what,
        key,
        held.holder.host,
        held.holder.pid if held.holder.pid is not None else "?",
        held.acquired_at.isoformat(),
        held.expires_at.isoformat(),
    )
