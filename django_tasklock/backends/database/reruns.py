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

A take writes the mark's row first (its lock; a holder's first take of a
key never marked makes the row), then reads it and the lease of the token,
then records itself (the token, the take's number, its answer) and moves
the payload to its answer. Sent again (its reply lost), the take finds its
own number and answers alike; an earlier take of the same lease arriving
late finds a larger number, and takes nothing. Marks older than
``RERUN_LIFETIME`` count as none.
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
    model: type[CacheEntry], alias: str, stored: str, key: str, token: str, taking: int
) -> str | None:
    """Take ``key``'s mark while ``token`` holds its live lease (see the module)."""
    marks = _marks(alias).filter(key=key)
    for _ in range(2):  # the second time, the row made the first time exists
        with transaction.atomic(using=alias):
            if marks.update(taken_by=F("taken_by")):  # the mark's row, locked
                return _take_locked(model, alias, stored, marks, token, taking)
        if not live_lease(model, alias, stored, token).exists():
            return None  # not the holder: nothing to take, nothing to record
        # No row yet: one to record the take in (a marker may be making it too).
        _marks(alias).bulk_create([_blank(key)], ignore_conflicts=True)
    raise AssertionError(f"the mark row of {key!r} was made, then was not there")


def _take_locked(
    model: type[CacheEntry],
    alias: str,
    stored: str,
    marks: QuerySet[RerunMark],
    token: str,
    taking: int,
) -> str | None:
    payload, taken_by, number, taken = marks.values_list(
        "payload", "taken_by", "taken_number", "taken"
    ).get()
    if taken_by == token and taking <= number:
        # Sent again (the same number), or a take before it arriving late: what
        # that take answered, or nothing; never a mark written since.
        return taken if taking == number else None
    if not live_lease(model, alias, stored, token).exists():
        return None  # the mark stays, for the key's next holder
    answer = payload if payload is not None and fresh(marks).exists() else None
    marks.update(payload=None, marked_at=None, taken_by=token, taken_number=taking, taken=answer)
    return answer


def _blank(key: str) -> RerunMark:
    from django_tasklock.models import RerunMark

    return RerunMark(key=key, payload=None, marked_at=None, taken_by="", taken_number=0)


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
