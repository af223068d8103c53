"""How the database backend ends a lease, and what it says it found.

A release is at most three statements, all bound to the key and the token:
with ``min_hold``, an UPDATE that cuts a young lease to end at acquisition +
``min_hold``; else the DELETE of the live row; when that finds nothing, the
DELETE of our own expired row (which makes it a loss). Sent once and finding
nothing, the lease was gone before: ``LOST``.

A release is sent again on a new connection when the first connection died
with the statement under way (see ``retries``): that statement may have
committed. Finding nothing of the token's then, the release cannot tell from
``cache_entries`` whether its own first sending deleted the row or someone
else did, and a successor may hold the key already. Only three other things
end a row before its holder's local deadline is past: an operator's force
release, a storage clock that stepped (see the lease's clock checks) and
``clear_stale`` of a row already expired (which its holder knows by its
local deadline). A force release leaves a record of the lease it ended
(:func:`record_forced`, in the transaction that deletes it): the release sent
again reads it. Recorded, the lease was the operator's to end: ``LOST``.
Not recorded, it was this release's own first sending: ``GONE``, whoever
holds the key now (the caller still counts a lease that could have run out
before the release was sent as lost).

A lease cut for ``min_hold`` keeps its row until then under the token marked
released (:func:`released`): a refresh or fence by the token no longer finds
it, so a copy sent before the release and arriving after it cannot extend the
cut lease to a full ttl; the same release sent again finds the mark: ``GONE``.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db.models import F

from django_tasklock.backends.base import STALE_AFTER, Released
from django_tasklock.backends.database.functions import UtcNow

#: Appended to the token of a lease a ``min_hold`` release cut: held until then,
#: but no longer the token's (no ``:`` in it: the holder still reads from it).
RELEASED_MARK = "~released"


def released(token: str) -> str:
    """The value of ``token``'s lease once a ``min_hold`` release cut it."""
    return token + RELEASED_MARK


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
        # lease to end then, while that is still ahead; else delete it. The
        # token is marked released with it, so that no refresh or fence that
        # reaches the database after the release (sent before it) finds it.
        ours = model.objects.using(alias).filter(key=stored, value=token)
        young = ours.filter(expires_at__gt=UtcNow(), created_at__gt=UtcNow() - min_hold)
        if young.update(expires_at=F("created_at") + min_hold, value=released(token)):
            return Released.RELEASED
    live, any_row = deletes
    if live.run(alias, stored, token):
        return Released.RELEASED
    if model.objects.using(alias).filter(key=stored, value=released(token)).exists():
        return Released.GONE  # this release, sent before, cut it already
    # Not live: lost. Still clear our own expired row, if it is there (a row
    # a min_hold release cut carries the mark, found above: this one ran out).
    if any_row.run(alias, stored, token) or not sent_before:
        return Released.LOST
    # Sent again, and nothing of ours: our first sending deleted it, unless an
    # operator did (whoever holds the key now).
    return Released.LOST if was_forced(alias, token) else Released.GONE


def forced_name(token: str) -> str:
    """How :class:`~django_tasklock.models.ForcedRelease` names a lease: its token's SHA-256."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def record_forced(alias: str, token: str) -> None:
    """Record that an operator ends ``token``'s lease; forget records older than 24 h.

    Sent again (a lost reply), the record is there already: nothing is added.
    No lease outlives 24 h, so no release can ask about an older record.
    """
    from django_tasklock.models import ForcedRelease

    records = ForcedRelease.objects.using(alias)
    records.filter(released_at__lt=UtcNow() - STALE_AFTER)._raw_delete(alias)
    records.bulk_create(
        [ForcedRelease(lease=forced_name(token), released_at=UtcNow())], ignore_conflicts=True
    )


def was_forced(alias: str, token: str) -> bool:
    """Whether an operator ended ``token``'s lease (:func:`record_forced`)."""
    from django_tasklock.models import ForcedRelease

    return ForcedRelease.objects.using(alias).filter(lease=forced_name(token)).exists()
