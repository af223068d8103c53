"""Sending a lease's release and judging what its answer means."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django_tasklock import notifier
from django_tasklock.backends.base import BaseBackend, Released, permit_key
from django_tasklock.leases.lease import clock
from django_tasklock.signals import lock_released

if TYPE_CHECKING:
    from datetime import timedelta

    from django_tasklock.leases.lease import Lease

logger = logging.getLogger("django_tasklock")


def send_release(lease: Lease, min_hold: timedelta | None) -> None:
    """Release ``lease`` and announce how it ended: released, expired, or lost.

    A failure is logged (the lease expires by itself).
    """
    sent_at = clock()
    try:
        if min_hold is None:
            found = lease.backend.release_outcome(lease.stored_as, lease.token)
        else:
            found = lease.backend.release_outcome(lease.stored_as, lease.token, min_hold=min_hold)
    except Exception:
        # Possibly on the heartbeat's thread (a rollback found by it): logged there
        # through the notifier, like the signals below.
        notifier.log(
            logging.WARNING,
            "Releasing task lock %r failed; the lease will expire by itself.",
            lease.key,
            exc_info=True,
        )
        return
    # Gone, and nobody else's: ended by this release sent twice (its reply
    # lost), unless the lease could have run out before it was sent.
    if found is Released.RELEASED or (found is Released.GONE and sent_at <= lease.valid_until):
        # Never "released" after "lost"; nothing to send without a receiver.
        if lock_released.receivers and not lease.declared:
            notifier.run(lease.announce, lock_released)
    elif found is Released.GONE or sent_at >= lease.valid_until:
        # It could have run out before the release was sent: an expiry,
        # whatever was at the key when the release looked.
        lease.expire(inline=True)
    else:
        lease.declare(lease.found_not_ours())


def discard(backend: BaseBackend, key: str, token: str) -> None:
    """Delete a lease we will not hand out (if granted); if that fails, it expires by itself."""
    try:
        backend.release(key, token)
    except Exception:
        logger.debug("Releasing %r after an unfinished acquisition failed.", key, exc_info=True)


def discard_permit(backend: BaseBackend, key: str, token: str, limit: int) -> None:
    """Delete the permit of ``key`` that ``token`` may have been granted, name unknown.

    A request for a permit that raised (interrupted, its reply lost) may have
    taken any of the ``limit`` permits: each is released by the token in
    turn, until one is (a token holds at most one permit of a key, and a
    release by a token that holds nothing deletes nothing). If that fails,
    the permit expires by itself.
    """
    for slot in range(limit):
        name = permit_key(key, slot)
        try:
            if backend.release(name, token):
                return
        except Exception:
            logger.debug(
                "Releasing the permits of %r after an unfinished acquisition failed.",
                key,
                exc_info=True,
            )
            return
