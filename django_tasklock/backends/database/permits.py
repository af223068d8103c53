"""The permits of a ``limit=N`` key as rows, and the anchor row that keeps their limit.

Permit ``i`` of key ``K`` is an ordinary lease row, ``task-lock:K\\x1fi``
(``base.permit_key``): refreshed, released, fenced and swept as any lease.
While any permit of ``K`` may be live, the row of ``K`` itself,
``task-lock:K``, is the key's **anchor**: its value is not a token but
``"\\x1flimit=N\\x1f<nonce>"`` (no token starts with the separator). The anchor is what
makes a mutex and a limited key of one name refuse each other, whoever comes
first, with no cost to a mutex's acquisition:

- a mutex's INSERT of ``task-lock:K`` conflicts with the anchor, and its one
  look at the row (``acquisitions``) sees an anchor: then :func:`settle_anchor`
  either finds live permits (``LimitMismatch``) or deletes the anchor of no
  live permit, and the INSERT is sent again;
- a permit's acquisition (:func:`take_permit`) finds a mutex's live row where
  its anchor would be (``LimitMismatch``), or an anchor of another limit
  with live permits (``LimitMismatch``).

Both run as one transaction that first writes the anchor's row (a no-op
UPDATE: PostgreSQL's and InnoDB's row lock, SQLite's write lock), so that a
permit's acquisition and an anchor's deletion never interleave: the
deletion sees every permit committed before it, and an acquisition after it
finds no anchor, and writes one (or, its INSERT conflicting with a mutex's,
starts again and finds the mutex). Under READ COMMITTED a row that did not
exist at that first write is not locked by it: an acquisition that then
finds an anchor starts again (and locks it), and a deletion whose anchor
changed deletes nothing. Every write of the anchor gives its value a new
nonce, so a statement bound to the value it saw never meets a later anchor
of the same limit. Within the transaction, one SELECT reads every row of
the key with its liveness by the server's clock; then at most two writes
for the permit (a stale row of the slot deleted, bound to its value, and
the new one inserted) and two for the anchor: 3 to 6 statements, and
another attempt only when the anchor changed or two acquisitions wrote the
first anchor at once.

The anchor outlives every permit it covers: each acquisition, after writing
the permit, sets the anchor's ``created_at`` to now and its ``expires_at``
to at least now + ``max_lifetime``, no earlier than the last moment the new
permit's row can live (the storage caps every lease at acquisition +
``max_lifetime``). So the generic
rules (an expired or 24 h old row is free; ``clear_stale``) never end an
anchor while a permit of it may be live; after the last permit, the next
mutex or limit deletes it, or it expires.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.db.models import BooleanField, ExpressionWrapper, F, Q
from django.db.models.functions import Greatest

from django_tasklock.backends.base import (
    PERMIT_SEPARATOR,
    STALE_AFTER,
    Holder,
    caller_key,
    limited_key,
    permit_key,
    storage_key,
)
from django_tasklock.backends.database.connections import is_key_conflict
from django_tasklock.backends.database.functions import UtcNow, key_starts_with
from django_tasklock.backends.database.releases import released
from django_tasklock.exceptions import LimitMismatch
from django_tasklock.processes import holder_gone

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from django_tasklock.models import CacheEntry

# Attempts when two acquisitions wrote a key's first anchor at once.
_ATTEMPTS = 5
_ANCHOR = PERMIT_SEPARATOR + "limit="


class _Changed(Exception):
    """The anchor's row changed between the look and the write: the attempt is rolled back."""


def anchor_value(limit: int) -> str:
    """A new value of a limited key's anchor row: its limit, and a nonce (no token).

    Each write of the anchor gives it a new nonce, so that a statement bound
    to the value it saw never meets a later anchor of the same limit.
    """
    return f"{_ANCHOR}{limit}{PERMIT_SEPARATOR}{secrets.token_hex(8)}"


def anchor_limit(value: str) -> int | None:
    """The limit an anchor row's value says; None for a lease's row (a token)."""
    if not value.startswith(_ANCHOR):
        return None
    return int(value[len(_ANCHOR) :].partition(PERMIT_SEPARATOR)[0])


def is_anchor() -> Q:
    """Rows whose value is an anchor's, for ``exclude()``: never a lease to show or end."""
    return Q(value__startswith=PERMIT_SEPARATOR)


def _rows_of(model: type[CacheEntry], alias: str, stored: str) -> QuerySet[CacheEntry]:
    """The anchor (or mutex) row of ``stored`` and its permits' rows."""
    return model.objects.using(alias).filter(
        Q(key=stored) | key_starts_with(stored + PERMIT_SEPARATOR)
    )


def _with_liveness(rows: QuerySet[CacheEntry]) -> list[tuple[str, str, bool]]:
    live = Q(expires_at__gt=UtcNow()) & Q(created_at__gt=UtcNow() - STALE_AFTER)
    annotated = rows.annotate(live=ExpressionWrapper(live, output_field=BooleanField()))
    return [
        (key, value, bool(alive))
        for key, value, alive in annotated.values_list("key", "value", "live")
    ]


def _lock_anchor(
    model: type[CacheEntry], alias: str, stored: str, value: str | None = None
) -> int:
    """A no-op write of the anchor's row (of ``value`` only, if given): how many rows it locked.

    The row's lock (PostgreSQL, InnoDB), or SQLite's write lock, till commit.
    A row that does not exist (yet) is not locked under READ COMMITTED: a
    caller that finds one afterwards must look again.
    """
    rows = model.objects.using(alias).filter(key=stored)
    if value is not None:
        rows = rows.filter(value=value)
    return rows.update(created_at=F("created_at"))


def _dead(value: str) -> bool:
    return holder_gone(Holder.from_token(value)) is True


def take_permit(
    model: type[CacheEntry],
    alias: str,
    key: str,
    token: str,
    *,
    limit: int,
    ttl: timedelta,
    max_lifetime: timedelta,
) -> tuple[str | None, bool]:
    """One of ``key``'s ``limit`` permits for ``token``: (its name, or None; whether inserted).

    The second value is False when nothing was written: all held, or the
    permit already ``token``'s (this acquisition sent again).
    """
    stored = storage_key(key)
    for _ in range(_ATTEMPTS):
        try:
            with transaction.atomic(using=alias):
                return _take(model, alias, key, stored, token, limit, ttl, max_lifetime)
        except IntegrityError as exc:
            if not is_key_conflict(exc):
                raise
            # Two first anchors, or a mutex's row written since our look: look again.
        except _Changed:
            pass  # the anchor's row changed since our look (rolled back): look again
    return None, False


def _take(
    model: type[CacheEntry],
    alias: str,
    key: str,
    stored: str,
    token: str,
    limit: int,
    ttl: timedelta,
    max_lifetime: timedelta,
) -> tuple[str | None, bool]:
    rows = model.objects.using(alias)
    locked = _lock_anchor(model, alias, stored)
    anchor: tuple[str, bool] | None = None
    permits: dict[int, tuple[str, bool]] = {}
    for name, value, live in _with_liveness(_rows_of(model, alias, stored)):
        if name == stored:
            anchor = (value, live)
        else:
            _, slot = limited_key(caller_key(name))
            if slot is not None:
                permits[slot] = (value, live)
    live_permits = {slot: value for slot, (value, live) in permits.items() if live}
    if anchor is not None:
        value, live = anchor
        held = anchor_limit(value)
        if held is None and live:
            raise LimitMismatch(key, held=1, asked=limit)  # a mutex's lease
        if held is not None and not locked:
            raise _Changed  # an anchor written since our lock: take its lock, then look
        if held is not None and held != limit and live_permits:
            raise LimitMismatch(key, held=held, asked=limit)
    if any(slot >= limit for slot in live_permits):  # an anchor deleted by hand
        raise LimitMismatch(key, held=max(live_permits) + 1, asked=limit)
    for slot, value in live_permits.items():
        if value == token:
            return permit_key(key, slot), False  # this acquisition sent again
        if value == released(token):
            return None, False  # arrived late: its permit was released (cut for min_hold)
    free = [s for s in range(limit) if s not in live_permits or _dead(live_permits[s])]
    if not free:
        return None, False
    now, life = UtcNow(), min(ttl, max_lifetime)
    # The permit first: the anchor's times, read by the server's clock in a
    # later statement, are then no earlier than the permit's, and the anchor
    # outlives the permit's cap (created_at + max_lifetime) by construction.
    slot = free[0]
    name = permit_key(key, slot)
    if slot in permits:  # a stale row, or a dead holder's: bound to its value
        rows.filter(key=storage_key(name), value=permits[slot][0])._raw_delete(alias)
    rows.create(key=storage_key(name), value=token, created_at=now, expires_at=now + life)
    if anchor is None or anchor_limit(anchor[0]) is None:
        if anchor is not None:  # a mutex's row, no longer live
            rows.filter(key=stored, value=anchor[0])._raw_delete(alias)
        rows.create(
            key=stored, value=anchor_value(limit), created_at=now, expires_at=now + max_lifetime
        )
    else:
        # Bound to the value seen: where the anchor did not exist at our first
        # write, nothing held its row for us, and a mutex's may be there now.
        updated = rows.filter(key=stored, value=anchor[0]).update(
            value=anchor_value(limit),
            created_at=now,
            expires_at=Greatest(F("expires_at"), now + max_lifetime),
        )
        if not updated:
            raise _Changed
    return name, True


def settle_anchor(model: type[CacheEntry], alias: str, stored: str, value: str) -> None:
    """A mutex found the anchor ``value`` at ``stored``: refuse, or delete it if no permit lives.

    Raises ``LimitMismatch`` while a permit of the key is live; else deletes
    the anchor (bound to ``value``) so that the mutex's INSERT can be sent again.
    """
    with transaction.atomic(using=alias):
        if not _lock_anchor(model, alias, stored, value):
            return  # not that anchor any more: the INSERT, sent again, finds what is there
        permits = _rows_of(model, alias, stored).exclude(key=stored)
        live = permits.filter(expires_at__gt=UtcNow(), created_at__gt=UtcNow() - STALE_AFTER)
        if live.exists():
            raise LimitMismatch(caller_key(stored), held=anchor_limit(value) or 0, asked=1)
        model.objects.using(alias).filter(key=stored, value=value)._raw_delete(alias)


def counter_key(key: str) -> str:
    """The key whose fence counter a lease's fences come from: a permit's, its key's."""
    return limited_key(key)[0]
