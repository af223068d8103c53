"""Held locks as operators see them, shared by ``manage.py tasklock`` and the admin page."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from django_tasklock.backends.base import HeldLock


def utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime (a naive one, from ``USE_TZ = False``, is UTC)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def fence(lock: HeldLock) -> int | None:
    """The lease's fence number, for backends that record one; else None."""
    value = getattr(lock, "fence", None)
    return value if isinstance(value, int) else None


def has_fences(locks: list[HeldLock]) -> bool:
    return any(fence(lock) is not None for lock in locks)


def seconds_held(lock: HeldLock) -> float:
    """How long the lease has been held, by the storage's clock.

    The time of reading is ``expires_at - seconds_left`` (both by the storage's
    clock at that reading), so the worker's clock plays no part: held = that
    moment - ``acquired_at``. Never negative.
    """
    read_at = utc(lock.expires_at) - timedelta(seconds=lock.seconds_left)
    return max(0.0, (read_at - utc(lock.acquired_at)).total_seconds())


def as_json(lock: HeldLock) -> dict[str, Any]:
    """One lock as a JSON object; times in ISO 8601, UTC, with their offset."""
    row: dict[str, Any] = {
        "key": lock.key,
        "host": lock.holder.host,
        "pid": lock.holder.pid,
        "acquired_at": utc(lock.acquired_at).isoformat(),
        "expires_at": utc(lock.expires_at).isoformat(),
        "seconds_held": round(seconds_held(lock), 3),
        "seconds_left": round(lock.seconds_left, 3),
    }
    if fence(lock) is not None:
        row["fence"] = fence(lock)
    return row


def when(moment: datetime, *, zone: bool = True) -> str:
    """A time to the second, in UTC, for tables: ``2026-11-30 12:45:01 UTC``.

    ``zone=False`` leaves out `` UTC``, for columns whose header says it.
    """
    return utc(moment).strftime("%Y-%m-%d %H:%M:%S UTC" if zone else "%Y-%m-%d %H:%M:%S")


def lease(lock: HeldLock) -> str:
    """Which lease, for prompts and messages: holder, acquisition time and lease name.

    Never the token: :attr:`HeldLock.lease` is a digest of it.
    """
    return (
        f"{lock.holder} since {when(lock.acquired_at)} "
        f"(lease {lock.lease}, held {duration(seconds_held(lock))}, "
        f"{duration(lock.seconds_left)} left)"
    )


def duration(seconds: float) -> str:
    """``4.2 s`` under a minute, then ``14 min 58 s``, then ``2 h 03 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
