"""Reading the ``inspect`` script's reply: who holds a key, since and until when."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from django_tasklock.backends.base import (
    STALE_AFTER,
    UNKNOWN_HOLDER,
    HeldLock,
    Holder,
    lease_id,
    permit_key,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_STALE_MS = int(STALE_AFTER / timedelta(milliseconds=1))


def text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def at_ms(ms: int) -> datetime:
    """A time the server gave in milliseconds since 1970, as an aware UTC datetime."""
    return _EPOCH + timedelta(milliseconds=ms)


def held_lock(key: str, reply: Any) -> HeldLock | None:
    """The lease the ``inspect`` script read at ``key``, or None when it found none."""
    if not reply:
        return None
    token, acquired_ms, pttl, now_ms = text(reply[0]), *map(int, reply[1:4])
    limit = int(reply[4]) if len(reply) > 4 else None  # a permit's: its key's limit
    now = _EPOCH + timedelta(milliseconds=now_ms)
    holder = Holder.from_token(token)
    if not 0 <= acquired_ms <= now_ms + _STALE_MS:
        # No lease written here began before 1970 or a day after now (a
        # time past any date comes back from Lua as a bogus integer): the
        # value is not ours, and shown as unknown, acquired when read.
        holder, acquired_ms = UNKNOWN_HOLDER, now_ms
    return HeldLock(
        key=key,
        holder=holder,
        acquired_at=_EPOCH + timedelta(milliseconds=acquired_ms),
        expires_at=now + timedelta(milliseconds=pttl),
        seconds_left=pttl / 1000,
        lease=lease_id(token),
        limit=limit,
    )


def permits_held(key: str, reply: Any) -> list[HeldLock]:
    """The live permits of the limited key ``key`` that the ``permits`` script read."""
    if not reply:
        return []
    now, limit, *rest = reply
    held = []
    fields = (rest[0::4], rest[1::4], rest[2::4], rest[3::4])
    for n, token, acquired, left in zip(*fields, strict=True):
        found = held_lock(permit_key(key, int(n)), [token, acquired, left, now, limit])
        if found is not None:
            held.append(found)
    return held
