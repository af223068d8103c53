"""What a lease tells the project: its signals, and the warning at a loss.

:class:`~django_tasklock.lease.Lease` sends ``lock_acquired``,
``lock_released``, ``lock_stalled`` and ``lock_lost`` through :func:`announce`,
which never lets a failing receiver reach the lock; :func:`announce_loss`
adds the warning that says why the lease was lost.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django_tasklock.reasons import EXPIRED, MAX_LIFETIME, RELEASED_BY_OPERATOR, TAKEN
from django_tasklock.signals import lock_lost

if TYPE_CHECKING:
    from django.dispatch import Signal

    from django_tasklock.lease import Lease

logger = logging.getLogger("django_tasklock")


def announce(lease: Lease, signal: Signal, **extra: object) -> None:
    """Send ``signal`` about ``lease``; a failing receiver is logged, never raised.

    The lock must not depend on receivers: an exception here would skip a
    release, or end a thread the whole process relies on.
    ``send_robust`` already logs each failure with its traceback (logger
    ``django.dispatch``), so this adds one line naming the key, without
    a second copy of the traceback. With no receiver connected (the usual
    case), nothing is built or sent.
    """
    if not signal.receivers:
        return
    for receiver, outcome in signal.send_robust(
        sender=type(lease.backend), key=lease.key, holder=lease.holder, **extra
    ):
        if isinstance(outcome, Exception):
            logger.error(
                "A receiver of a django-tasklock signal about %r failed: %r raised %r "
                "(traceback on the django.dispatch logger).",
                lease.key,
                receiver,
                outcome,
            )


def announce_loss(lease: Lease) -> None:
    """The warning and the ``lock_lost`` signal (with ``reason``) for a loss just marked."""
    logger.warning(
        "Task lock %r was lost (%s): %s, while %s held it.",
        lease.key,
        lease.reason,
        _WHY.get(lease.reason or "", "it was lost"),
        lease.holder,
    )
    announce(lease, lock_lost, reason=lease.reason)


_WHY = {
    EXPIRED: "no refresh was confirmed within its ttl, so it may have expired",
    TAKEN: "another holder has the key",
    RELEASED_BY_OPERATOR: "the key was found free before its deadline (force-released, "
    "or lost by the storage)",
    MAX_LIFETIME: "it reached its max_lifetime and is no longer extended",
}
