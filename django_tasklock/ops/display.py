"""Held locks as operators see them, shared by ``manage.py tasklock`` and the admin page."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from django_tasklock.backends.base import HeldLock, Holder, limited_key
from django_tasklock.processes import holder_gone


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


def gone(lock: HeldLock) -> bool | None:
    """Whether the lease's holder process is gone: True, False, or None when this
    process cannot tell (another machine or container, an older version's token).

    A lease whose holder is gone is taken over by the next acquisition on the
    holder's machine, and reaped by the heartbeat of any process there that
    holds a lease; from elsewhere it ends by its ttl.
    """
    return holder_gone(lock.holder)


GONE = "holder process gone"


def key(lock: HeldLock) -> str:
    """The caller's key of a lease: a permit's key without its number (as callers wrote it)."""
    return limited_key(lock.key)[0]


def permit(lock: HeldLock) -> int | None:
    """A permit's number (as stored: from 0), or None for a mutex's lease.

    The limit its key was taken with is :attr:`HeldLock.limit`.
    """
    return limited_key(lock.key)[1]


def named(key: str, permit: int | None) -> str:
    """A lease as operators name it: ``'k'``, or ``permit 2 of 'k'`` (the key :func:`repr`'d).

    Never the permit's stored name (the key, a unit separator, the number):
    operators can neither read nor type the separator.
    """
    return repr(key) if permit is None else f"permit {permit} of {key!r}"


@dataclasses.dataclass(frozen=True)
class Held:
    """One caller's key and its live leases: a mutex's one, or a limited key's permits."""

    key: str  #: the caller's key
    locks: list[HeldLock]  #: a mutex's lease, or the permits by number

    @property
    def permits(self) -> list[int]:
        """The numbers of the permits held (none for a mutex)."""
        return [n for lock in self.locks if (n := permit(lock)) is not None]

    @property
    def limit(self) -> int | None:
        """The limit the permits were taken with, as the storage read it (None: a mutex)."""
        return max((lock.limit for lock in self.locks if lock.limit is not None), default=None)

    @property
    def limited(self) -> bool:
        """Whether the key is held as permits (of a ``limit=N`` key), not as a mutex."""
        return bool(self.permits)


def by_key(locks: list[HeldLock]) -> list[Held]:
    """``locks`` by caller's key, in the order listed; a key's permits by their number.

    A limited key held by 3 permits is one :class:`Held` of 3 leases. Its
    permits come after the key in the storage's order (the separator sorts
    before every printable character), but they are gathered whatever the order.
    """
    groups: dict[str, list[HeldLock]] = {}
    for lock in locks:
        groups.setdefault(key(lock), []).append(lock)
    return [
        Held(name, sorted(found, key=lambda lock: (permit(lock) is not None, permit(lock) or 0)))
        for name, found in groups.items()
    ]


def permits_held(count: int, limit: int | None = None) -> str:
    """``2 of 3 permits held``; without the limit, ``1 permit held``, ``3 permits held``."""
    if limit is not None:
        return f"{count} of {limit} permits held"
    return f"{count} permit held" if count == 1 else f"{count} permits held"


def rerun_marked(marks: dict[str, datetime] | None, name: str) -> datetime | None:
    """When the caller's key ``name`` was last marked "run once more"; None if it is not
    (or ``marks`` is None: the backend cannot mark keys)."""
    return None if marks is None else marks.get(name)


def not_held(marked_at: datetime) -> str:
    """What a marked key nobody holds is, in words: the line ``list`` and the admin show."""
    return f"not held; marked to run once more (since {when(marked_at)})"


def with_unheld(
    items: Iterable[Any], marks: dict[str, datetime] | None, name: Any
) -> Iterator[tuple[str, Any]]:
    """``items`` (each named by ``name(item)``, in the storage's order by key) as
    ``(key, item)``, with each key of ``marks`` no item has as ``(key, None)``, merged
    in by key: the marked keys nobody holds, among the held ones."""
    listed = [(name(item), item) for item in items]
    held = {key for key, _ in listed}
    unheld = [(key, None) for key in sorted(marks or {}) if key not in held]
    return heapq.merge(listed, unheld, key=lambda pair: pair[0])


def as_json(lock: HeldLock, marks: dict[str, datetime] | None = None) -> dict[str, Any]:
    """One lock as a JSON object; times in ISO 8601, UTC, with their offset.

    ``holder_gone``: :func:`gone` (null when it cannot be told from here).
    ``key`` is the caller's key, a permit's too; ``permit`` the permit's
    number (:func:`permit`) and ``limit`` its key's limit, both null for a
    mutex's lease. ``held`` is true (:func:`unheld_as_json` gives the false
    ones). ``marks``: the backend's :meth:`~BaseBackend.rerun_marks`, or None
    for a backend that cannot mark keys: then ``rerun_marked_at`` is left out,
    else it is when the key was last marked to run once more, or null.
    """
    row: dict[str, Any] = {
        "key": key(lock),
        "permit": permit(lock),
        "limit": lock.limit,
        "host": lock.holder.host,
        "pid": lock.holder.pid,
        "acquired_at": utc(lock.acquired_at).isoformat(),
        "expires_at": utc(lock.expires_at).isoformat(),
        "seconds_held": round(seconds_held(lock), 3),
        "seconds_left": round(lock.seconds_left, 3),
        "holder_gone": gone(lock),
        "held": True,
    }
    if marks is not None:
        marked_at = rerun_marked(marks, key(lock))
        row["rerun_marked_at"] = None if marked_at is None else utc(marked_at).isoformat()
    if fence(lock) is not None:
        row["fence"] = fence(lock)
    return row


#: The fields of :func:`as_json` that describe a lease: null for a key nobody holds.
LEASE_FIELDS = (
    "permit",
    "limit",
    "host",
    "pid",
    "acquired_at",
    "expires_at",
    "seconds_held",
    "seconds_left",
    "holder_gone",
)


def unheld_as_json(name: str, marked_at: datetime) -> dict[str, Any]:
    """A key marked "run once more" that nobody holds, shaped as :func:`as_json`'s
    objects: its lease's fields null, ``held`` false."""
    return {
        "key": name,
        **dict.fromkeys(LEASE_FIELDS),
        "held": False,
        "rerun_marked_at": utc(marked_at).isoformat(),
    }


def printable(text: str) -> str:
    """``text`` for a terminal: on one line, with nothing in it a terminal would act on.

    A key or a holder's host is anything a caller (or another tool writing in the
    namespace) stored: raw, an ESC or a BEL would drive the terminal, a CR or an
    LF would print a forged row, a bidi override would reorder the row. Every
    character Python does not count as printable (``str.isprintable``: C0 and C1
    controls, DEL, format characters such as the bidi overrides and isolates,
    separators but the space) is escaped as ``repr`` escapes it (``\\x1b``,
    ``\\n``, ``\\u202e``), and so is the backslash (``\\\\``), so that two
    texts are never shown alike. Printable text, the usual case, comes back as it is.
    """
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(
        char if char.isprintable() and char != "\\" else repr(char)[1:-1] for char in text
    )


def holder(who: Holder) -> str:
    """``host:pid`` of a holder, its host :func:`printable`."""
    return printable(str(who))


def when(moment: datetime, *, zone: bool = True) -> str:
    """A time to the second, in UTC, for tables: ``2026-11-30 12:45:01 UTC``.

    ``zone=False`` leaves out `` UTC``, for columns whose header says it.
    """
    return utc(moment).strftime("%Y-%m-%d %H:%M:%S UTC" if zone else "%Y-%m-%d %H:%M:%S")


def lease(lock: HeldLock) -> str:
    """Which lease, for prompts and messages: holder, acquisition time and lease name.

    Never the token: :attr:`HeldLock.lease` is a digest of it. The host is
    :func:`printable`.
    """
    return (
        f"{holder(lock.holder)} since {when(lock.acquired_at)} "
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


def shortened(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, its end replaced by ``…`` when it was longer.

    For a table's column: a full key is in ``--json``, and on the admin page.
    """
    return text if len(text) <= width else text[: width - 1] + "…"


def storage(backend: object) -> str:
    """Where ``backend`` keeps its locks, in words for operators.

    ``the database "default" (PostgreSQL)``, ``Redis (127.0.0.1:6379, db 0)``,
    ``this process's memory``; another backend by its class's name.
    """
    using = getattr(backend, "using", None)
    if isinstance(using, str):  # the database backend
        from django.db import connections

        return f"the database {using!r} ({connections[using].display_name})"
    location = getattr(backend, "location", None)
    if callable(location):  # Redis
        try:
            return f"Redis ({location()})"
        except Exception:
            return "Redis"
    if type(backend).__name__ == "MemoryBackend":
        return "this process's memory"
    return f"the {type(backend).__qualname__} backend"
