"""How the database backend ends a lease, and what it says it found.

A release is at most three statements, all bound to the key and the token:
with ``min_hold``, an UPDATE that cuts a young lease to end at acquisition +
``min_hold``; else the DELETE of the live row; when that finds nothing, the
DELETE of our own expired row (which makes it a loss). A release is sent again
on a new connection when the first connection died with the statement under
way (see ``retries``): that statement may have committed, so a second sending
that finds nothing, and the key nobody else's, answers ``GONE`` rather than
a loss; one that finds our own row run out (the first sending cut it, and
``min_hold`` has passed since) deletes it and answers ``RELEASED``. Sent once
and finding nothing, the lease was gone before: ``LOST``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.db.models import F

from django_tasklock.backends.base import Released
from django_tasklock.backends.database import rows as db_rows
from django_tasklock.backends.database.functions import UtcNow

if TYPE_CHECKING:
    from django_tasklock.backends.database.statements import Release
    from django_tasklock.models import CacheEntry


def end_lease(
    model: type[CacheEntry],
    alias: str,
    deletes: tuple[Release, Release],
    stored: str,
    token: str,
    min_hold: timedelta | None,
    *,
    sent_before: bool,
) -> Released:
    """End ``token``'s lease of ``stored`` on ``alias``; ``deletes``: (live rows, any row)."""
    if min_hold is not None:
        # Held until created_at + min_hold, by the server's clock: cut the
        # lease to end then, while that is still ahead; else delete it.
        ours = model.objects.using(alias).filter(key=stored, value=token)
        young = ours.filter(expires_at__gt=UtcNow(), created_at__gt=UtcNow() - min_hold)
        if young.update(expires_at=F("created_at") + min_hold):
            return Released.RELEASED
    live, any_row = deletes
    if live.run(alias, stored, token):
        return Released.RELEASED
    # Not live: lost. Still clear our own expired row, if it is there.
    if any_row.run(alias, stored, token):
        # Sent again, our own row was still there, so nobody else's: the first
        # sending cut it to end at min_hold, which has passed since.
        return Released.RELEASED if sent_before else Released.LOST
    if not sent_before:
        return Released.LOST
    if db_rows.live(model, alias).filter(key=stored).exists():
        return Released.LOST  # someone else's now
    return Released.GONE
