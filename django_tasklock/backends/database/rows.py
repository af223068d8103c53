"""Which rows of ``cache_entries`` are live or stale, and how a row is shown.

A row is *live* while it has not expired and was acquired less than 24 h ago
(``STALE_AFTER``); any other row in the namespace is *stale*: free to take
over, and what ``clear_stale`` deletes. Both are judged by the database
server's clock (``UtcNow``), in the statement itself or in the same look that
read the row. ``peek`` and ``list`` show live rows as :class:`HeldLock`, with
times in aware UTC whatever ``USE_TZ`` is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q

from django_tasklock.backends.base import STALE_AFTER, HeldLock, Holder, caller_key, lease_id
from django_tasklock.backends.database.functions import AsUtc, UtcNow, aware_utc, in_namespace

if TYPE_CHECKING:
    from datetime import datetime

    from django.db.models import QuerySet

    from django_tasklock.models import CacheEntry


def lock_model() -> type[CacheEntry]:
    """The model of the rows, or ``ImproperlyConfigured`` saying how to install it."""
    if not apps.is_installed("django_tasklock"):
        raise ImproperlyConfigured(
            'The database backend of django-tasklock needs "django_tasklock" in '
            "INSTALLED_APPS (and manage.py migrate), or choose another TASKLOCK_BACKEND."
        )
    from django_tasklock.models import CacheEntry

    return CacheEntry


def live(model: type[CacheEntry], alias: str) -> QuerySet[CacheEntry]:
    """Live rows in the namespace, with their times (and the server's) in UTC for :func:`held`."""
    return (
        model.objects.using(alias)
        .filter(in_namespace(), expires_at__gt=UtcNow())
        .filter(created_at__gt=UtcNow() - STALE_AFTER)
        .annotate(
            utc_created=AsUtc("created_at"),
            utc_expires=AsUtc("expires_at"),
            server_now=AsUtc(UtcNow()),
        )
    )


def live_lease(
    model: type[CacheEntry], alias: str, stored: str, token: str
) -> QuerySet[CacheEntry]:
    """The row of ``stored`` while ``token`` holds it live (no row otherwise)."""
    return (
        model.objects.using(alias)
        .filter(key=stored, value=token, expires_at__gt=UtcNow())
        .filter(created_at__gt=UtcNow() - STALE_AFTER)
    )


def stale(model: type[CacheEntry], alias: str) -> QuerySet[CacheEntry]:
    """Rows free to take over: expired, or acquired more than 24 h ago."""
    rows = model.objects.using(alias).filter(in_namespace())
    return rows.filter(Q(expires_at__lte=UtcNow()) | Q(created_at__lte=UtcNow() - STALE_AFTER))


def held(row: CacheEntry) -> HeldLock:
    """A row of :func:`live` as the API shows it: times in aware UTC, whatever ``USE_TZ`` is."""
    return held_values(
        row.key,
        row.value,
        row.utc_created,  # type: ignore[attr-defined]
        row.utc_expires,  # type: ignore[attr-defined]
        row.server_now,  # type: ignore[attr-defined]
    )


def held_values(
    stored: str, token: str, created: datetime, expires: datetime, now: datetime
) -> HeldLock:
    """:func:`held` of a row read as values (``statements.Peek``)."""
    expires_at = aware_utc(expires)
    return HeldLock(
        key=caller_key(stored),
        holder=Holder.from_token(token),
        acquired_at=aware_utc(created),
        expires_at=expires_at,
        seconds_left=max(0.0, (expires_at - aware_utc(now)).total_seconds()),
        lease=lease_id(token),
    )
