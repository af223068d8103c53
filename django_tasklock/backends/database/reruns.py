"""Keys marked "run once more" for the database backend: a row per key in ``tasklock_reruns``.

The mark lives in a table of its own, not in ``cache_entries``, so that it
outlives the lease it was set on (expiry, a takeover, ``clear_stale``, a
force release end the lease, never the mark) and waits for the key's next
holder.

A mark is written only while a live lease holds the key, in one transaction
that first writes that lease's row (a no-op UPDATE: PostgreSQL's and InnoDB's
row lock, SQLite's write lock), the same row a release deletes: the mark is
committed before the release, which then finds it, or the release goes
first and the UPDATE finds no row (PostgreSQL re-checks a row deleted while
it waited; InnoDB's UPDATE reads the latest row), and nothing is written.

A take writes the mark's row first (its lock), then reads it and the lease
of the token, then moves the payload to ``taken`` under the take's name.
Sent again (its reply lost), the take finds its own name and answers the
same payload; a copy arriving after a newer mark finds its name too, and
leaves that mark alone. Marks older than ``RERUN_LIFETIME`` count as none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import F

from django_tasklock.backends.base import RERUN_LIFETIME, STALE_AFTER
from django_tasklock.backends.database.functions import AsUtc, UtcNow, aware_utc
from django_tasklock.backends.database.permits import is_anchor
from django_tasklock.backends.database.rows import live_lease

if TYPE_CHECKING:
    from datetime import datetime

    from django.db.models import QuerySet

    from django_tasklock.models import CacheEntry, RerunMark


def _marks(alias: str) -> QuerySet[RerunMark]:
    from django_tasklock.models import RerunMark

    return RerunMark.objects.using(alias)


def mark(model: type[CacheEntry], alias: str, stored: str, key: str, payload: str) -> bool:
    """Mark ``key`` (stored as ``stored``) while a live mutex lease holds it; else False."""
    held = (
        model.objects.using(alias)
        .filter(key=stored, expires_at__gt=UtcNow(), created_at__gt=UtcNow() - STALE_AFTER)
        .exclude(is_anchor())  # a limited key's anchor: its permits are not the key's lease
    )
    with transaction.atomic(using=alias):
        if not held.update(expires_at=F("expires_at")):  # the lease's row, locked
            return False
        # Every marker of the key waits here for the lease's row: none creates
        # the mark's row beside another.
        marks = _marks(alias)
        if not marks.filter(key=key).update(payload=payload, marked_at=UtcNow()):
            marks.create(key=key, payload=payload, marked_at=UtcNow())
        return True


def take(
    model: type[CacheEntry], alias: str, stored: str, key: str, token: str, taking: str
) -> str | None:
    """Take ``key``'s mark while ``token`` holds its live lease (see the module)."""
    marks = _marks(alias).filter(key=key)
    with transaction.atomic(using=alias):
        if not marks.update(taken_by=F("taken_by")):  # the mark's row, locked; or none
            return None
        payload, taken_by, taken = marks.values_list("payload", "taken_by", "taken").get()
        if taken_by == taking:
            return taken  # sent again, or arriving late: what this take took
        if payload is None or not fresh(marks).exists():
            return None
        if not live_lease(model, alias, stored, token).exists():
            return None  # the mark stays, for the key's next holder
        marks.update(payload=None, marked_at=None, taken_by=taking, taken=payload)
        return payload


def fresh(marks: QuerySet[RerunMark]) -> QuerySet[RerunMark]:
    """The marks set now, and set less than ``RERUN_LIFETIME`` ago."""
    return marks.filter(payload__isnull=False, marked_at__gt=UtcNow() - RERUN_LIFETIME)


def marked(alias: str, key: str | None) -> dict[str, datetime]:
    """Every key marked now (``key``'s alone, if given), with when, in aware UTC."""
    marks = fresh(_marks(alias))
    if key is not None:
        marks = marks.filter(key=key)
    rows = marks.annotate(utc=AsUtc("marked_at")).order_by("key").values_list("key", "utc")
    return {name: aware_utc(when) for name, when in rows}
