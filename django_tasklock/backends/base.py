"""The backend contract: what a storage backend must do for the lock service.

A backend stores at most one lease per key. Every method takes the *caller's*
key (``"community-pr:abc-123"``); the backend stores it as
``"task-lock:" + key`` and never reads, lists or deletes anything that does not
start with that prefix.

Times that decide who holds a key (expiry, the 24 h staleness cap) come from
the storage's own clock (the database server, Redis), never from the worker's,
so that workers with skewed clocks cannot steal a live lease or keep a dead one.

Backends know nothing of the service, heartbeats, decorators or asyncio; the
service drives them through these methods only. A backend instance must be
safe to use from several threads at once.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import hashlib
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, ClassVar, NamedTuple

from django_tasklock.backends.listening import Watch, unwatched
from django_tasklock.durations import MAX_DURATION

# Re-exported: the records are part of the backend contract (peek, list).
from django_tasklock.holders import UNKNOWN_HOLDER as UNKNOWN_HOLDER
from django_tasklock.holders import HeldLock as HeldLock
from django_tasklock.holders import Holder as Holder

KEY_PREFIX = "task-lock:"
#: A row whose holder acquired it longer ago than this is abandoned, whatever
#: its ``expires_at``. Equal to the largest allowed ``max_lifetime``.
STALE_AFTER = MAX_DURATION
#: How long a "run once more" mark (:meth:`BaseBackend.mark_rerun`) lasts untaken:
#: the longest a lease can live, so that a mark outlives the lease it was set on.
RERUN_LIFETIME = MAX_DURATION


def storage_key(key: str) -> str:
    """The key as stored: the caller's key with the namespace prefix."""
    return KEY_PREFIX + key


def caller_key(stored: str) -> str:
    """The caller's key from a stored key."""
    return stored[len(KEY_PREFIX) :]


#: Separates a limited key from the number of one of its permits in the
#: permit's name (:func:`permit_key`). Keys may not contain it.
PERMIT_SEPARATOR = "\x1f"


def permit_key(key: str, slot: int) -> str:
    """The name of permit ``slot`` (from 0) of the limited key ``key``.

    A permit is a lease of its own: every single-lease method (``refresh``,
    ``refresh_many``, ``release``, ``release_outcome``, ``fence``,
    ``force_release``, ``peek``) takes its name where it takes a key, and
    the backend stores it as it sees fit. Callers' keys never contain the
    separator, so no caller's key names a permit.
    """
    return f"{key}{PERMIT_SEPARATOR}{slot}"


def longest_limited_key(limit: int) -> int:
    """How many characters a key may have with ``limit``: its permits' names must fit too.

    A stored key is at most 255 characters (the column), so a caller's key at
    most 245; a permit's name adds the separator and the slot's digits.
    """
    return 255 - len(KEY_PREFIX) - len(PERMIT_SEPARATOR) - len(str(limit - 1))


def check_limited_key(key: str, limit: int) -> None:
    """``ValueError`` naming ``key`` when its permits' names would not fit the storage,
    and naming ``limit`` when it is not an int of 2 or more (1 is a mutex: ``acquire``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 2:
        raise ValueError(f"limit must be an int of 2 or more for permits, got {limit!r}")
    longest = longest_limited_key(limit)
    if len(key) > longest:
        raise ValueError(
            f"key must be at most {longest} characters with limit={limit} "
            f"(its permits' names must fit), got {len(key)}"
        )


def limited_key(key: str) -> tuple[str, int | None]:
    """The caller's key and the permit's number, of a name :func:`permit_key` gave.

    ``(key, None)`` for a caller's key itself (a mutex's lease).
    """
    base, separator, slot = key.partition(PERMIT_SEPARATOR)
    return (base, int(slot)) if separator else (key, None)


def lease_id(token: str) -> str:
    """A short name of one lease, safe to show: a digest of its token, never the token.

    Operators confirm a force release of the lease a page or a prompt showed
    by this name, so that a key that changed hands meanwhile is not released.
    """
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:12]


class Refresh(NamedTuple):
    """One lease to extend in :meth:`BaseBackend.refresh_many`: the arguments of ``refresh``.

    A named tuple: the heartbeat makes one per lease per tick.
    """

    key: str  #: the caller's key, without the ``task-lock:`` prefix
    token: str
    ttl: timedelta
    max_lifetime: timedelta


class PartlyRefreshed(Exception):
    """Raised by :meth:`BaseBackend.refresh_many` when part of the storage failed.

    ``answers``: one per item, as ``refresh`` would give, or None for an item
    whose part failed (not refreshed this time, as if the whole call had
    failed); the error is the ``__cause__``. A Redis Cluster with one master
    unreachable answers the leases of the others.
    """

    def __init__(self, answers: list[bool | None], error: Exception) -> None:
        super().__init__(f"{answers.count(None)} of {len(answers)} leases not refreshed: {error}")
        self.answers = answers
        self.__cause__ = error


class Released(enum.Enum):
    """What :meth:`BaseBackend.release_outcome` found."""

    #: This call ended the lease (or, with ``min_hold``, cut it to end then).
    RELEASED = "released"
    #: The key is someone else's now, or the lease was found run out: a loss.
    LOST = "lost"
    #: Nothing of this token's, and the key is nobody else's: the lease ended
    #: before (ran out, force-released), or this very release, sent before,
    #: ended it and its reply was lost. The storage cannot tell which; the
    #: caller, who knows whether the lease could have run out, decides.
    #: Also a storage that knows this very release ended the lease (Redis:
    #: its tombstone) answers so, whoever holds the key now.
    GONE = "gone"


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend can promise, so the contract suite asks only that.

    ``cross_process``: two processes (or machines) exclude each other.
    ``server_clock``: expiry is judged by a clock shared by every worker.
    ``dead_holders``: a lease whose holder is provably gone
    (:func:`~django_tasklock.processes.holder_gone`) is taken over at once by
    :meth:`BaseBackend.acquire`, and ended by
    :meth:`BaseBackend.reap_dead_holders`, each bound to that holder's token
    (see both). Without it (this default), such a lease ends by its ttl, as
    any other.
    ``permits``: :meth:`BaseBackend.acquire_permit` gives ``limit=N`` keys'
    permits, and :meth:`BaseBackend.acquire` refuses a key whose permits are
    held. Without it (this default), only ``limit=1`` is served.
    ``rerun``: a key can be marked "run once more" (:meth:`BaseBackend.mark_rerun`).
    """

    cross_process: bool = True
    server_clock: bool = True
    dead_holders: bool = False
    #: :meth:`BaseBackend.acquire_permit` is implemented: ``limit=N`` keys.
    permits: bool = False
    #: :meth:`BaseBackend.mark_rerun`, :meth:`BaseBackend.take_rerun` and
    #: :meth:`BaseBackend.rerun_marks` are implemented: ``on_locked="rerun"``.
    rerun: bool = False


class BaseBackend(abc.ABC):
    """Storage for leases. Subclass it and name the class in ``TASKLOCK_BACKEND``.

    ``ttl`` and ``max_lifetime`` arrive validated (positive, ``max_lifetime``
    at most 24 h). A backend raises its storage's own exceptions when the
    storage cannot be reached: the service reports them, never as "held".
    """

    capabilities: ClassVar[Capabilities] = Capabilities()

    @classmethod
    def from_settings(cls) -> BaseBackend:
        """Build the backend from Django settings (``TASKLOCK_*``)."""
        return cls()

    @classmethod
    def check(cls) -> list[Any]:
        """System-check messages about this backend's configuration."""
        return []

    @abc.abstractmethod
    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        """Store a lease for ``key`` held by ``token``, ending ``ttl`` from now.

        Returns False when a live lease of another holder exists; True when
        the live lease is ``token``'s own (this acquisition sent again after
        its reply was lost, which must not become a lease nobody runs). A lease that
        has expired, or whose holder acquired it more than 24 h ago, is taken
        over. ``max_lifetime`` is recorded or enforced so that no later
        :meth:`refresh` extends the lease past acquisition + ``max_lifetime``.

        With the capability ``dead_holders``, a live lease whose holder is
        provably gone (``holder_gone(Holder.from_token(its_token)) is True``,
        looked at only once the key is found held) is taken over too, in one
        conditional step bound to that token: replaced only if that token
        still holds the key, so that of two processes doing so at once one
        wins and the other finds the winner's lease. Never a lease cut by a
        ``min_hold`` release: it is meant to outlive its holder.
        """

    def acquire_permit(
        self, key: str, token: str, *, limit: int, ttl: timedelta, max_lifetime: timedelta
    ) -> str | None:
        """Take one of the ``limit`` permits of ``key`` for ``token``; its name, or None.

        At most ``limit`` (2 or more, validated) live permits of one key at
        once, each a lease of its own, named ``permit_key(key, slot)`` with
        ``slot`` from 0 to ``limit - 1``, and never one slot to two holders.
        The name is what the other single-lease methods take for it. None
        when all ``limit`` are held live by other tokens. A live permit of
        ``token`` itself is answered with its name (this acquisition sent
        again); expired, 24 h old and (with ``dead_holders``) provably dead
        holders' permits are taken over as :meth:`acquire` takes over a
        lease. Fences of a limited key (:meth:`fence` of any of its permits)
        come from one counter, the key's own.

        Raises :class:`~django_tasklock.exceptions.LimitMismatch`, writing
        nothing, when the key is held live with another limit: by permits
        taken with another ``limit``, or by a mutex's lease (limit 1). And
        :meth:`acquire` of a key whose permits are held live raises it too.
        A key longer than :func:`longest_limited_key` is a ``ValueError``
        (:func:`check_limited_key`), before anything is written. Backends
        without the capability ``permits`` leave this method as is.
        """
        raise NotImplementedError(f"{type(self).__name__} does not give permits (limit=N)")

    @abc.abstractmethod
    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        """Extend a live lease held by ``token`` to ``ttl`` from now.

        Never past acquisition + ``max_lifetime``, and never resurrecting a
        lease that has already expired. Returns False when the lease is gone
        or held by another token (the caller has lost it); True otherwise,
        including when the cap kept the lease from being extended.
        """

    def refresh_many(self, items: Sequence[Refresh]) -> list[bool]:
        """:meth:`refresh` for each item, in order; the heartbeat's one call per tick.

        Returns one answer per item, as ``refresh`` would. Raises the storage's
        exception when it fails: the heartbeat then counts every item of the
        call as not refreshed this time (only those :class:`PartlyRefreshed`
        answers None, when a part of the storage answered). This default calls
        ``refresh`` once per item, so a backend written against the single-lease contract keeps
        working; the built-in backends send one statement per chunk of items.
        """
        return [
            self.refresh(item.key, item.token, ttl=item.ttl, max_lifetime=item.max_lifetime)
            for item in items
        ]

    @abc.abstractmethod
    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        """End the lease if, and only if, ``token`` holds it live. True if it did.

        With ``min_hold`` the key is not freed before acquisition + ``min_hold``
        (by the storage's clock): while that is still ahead, the lease is made
        to end exactly then instead of being deleted, so the key stays held
        even if this process dies. ``min_hold`` arrives validated (at most
        ``max_lifetime``); it is passed only when the caller asked for it.
        """

    def release_outcome(
        self, key: str, token: str, *, min_hold: timedelta | None = None
    ) -> Released:
        """:meth:`release`, saying what it found: the lock's release calls this.

        A release may be sent twice (its reply lost, the backend or the
        client library sending it again): the second finds the lease gone,
        although the first ended it. A backend that can be sent a release
        twice answers :attr:`Released.GONE` when it finds no lease of
        ``token`` and the key nobody else's, so that the holder is not told
        of a loss that did not happen (and may, when it knows that this very
        release ended the lease, whoever holds the key now); one that knows
        the release was sent once only may answer :attr:`Released.LOST`
        then. This default, for backends written before it, is
        :meth:`release` (False: ``LOST``).
        """
        if min_hold is None:
            released = self.release(key, token)
        else:
            released = self.release(key, token, min_hold=min_hold)
        return Released.RELEASED if released else Released.LOST

    @abc.abstractmethod
    def force_release(self, key: str, lease: str | None = None) -> HeldLock | None:
        """End the live lease of ``key`` whoever holds it (operators only).

        With ``lease`` (a :attr:`HeldLock.lease` an operator was shown), only
        that lease is ended: if the key changed hands meanwhile, nothing is.
        Without it, the lease holding the key now is. Either way the deletion
        is bound to that lease's token, so a re-sent deletion never ends a
        successor's lease. Returns the lease ended, or None when there was
        none to end (or not the one named). A deletion that finds that lease
        already gone still returns it: its reply may have been lost and the
        deletion sent again, and either way the lease seen is over.
        """

    @abc.abstractmethod
    def peek(self, key: str) -> HeldLock | None:
        """The live lease of ``key``, or None when nobody holds it."""

    @abc.abstractmethod
    def list(self) -> list[HeldLock]:
        """Every live lease, ordered by key."""

    @abc.abstractmethod
    def clear_stale(self, *, dry_run: bool = False) -> int:
        """Delete expired and abandoned (older than 24 h) leases; return how many.

        With ``dry_run`` nothing is deleted and the count is of what would be.
        """

    def fence(self, key: str, token: str) -> int | None:
        """The next fencing token of ``key``, if ``token`` holds its live lease; else None.

        Fencing tokens of a key strictly increase across every grant, whoever
        held it, through expiry, crashes, ``force_release`` and
        ``clear_stale``: the counter lives outside the lock namespace and no
        sweep touches it. The check that ``token`` still holds the lease and
        the increment must be one atomic step, so that a holder paused
        between acquiring and fencing never gets a number above its
        successor's. A backend that cannot do this leaves this method as is.
        """
        raise NotImplementedError(f"{type(self).__name__} does not give fencing tokens")

    def mark_rerun(self, key: str, payload: str) -> bool:
        """Mark ``key`` "run once more", carrying ``payload``, while a live lease holds it.

        True: marked; a mark already there now carries ``payload`` (the latest
        skipped call's), so many marks make one. The holder takes it with
        :meth:`take_rerun` before it lets go. False: nobody holds ``key`` live
        and nothing was written (the caller may take the key itself). The
        look at the lease and the write are one atomic step against the
        lease's release and takeover: a mark is written while the lease it saw
        still holds the key, or not at all. A mark outlives its lease (a
        holder that dies or loses its lease leaves it to the key's next
        holder) and lasts :data:`RERUN_LIFETIME` unless taken. Sent twice, it
        marks once; a copy arriving late marks nothing (the key free) or the
        next holder's lease (one run more, never one less). A limited key's
        permits are not leases of ``key``: only a mutex's lease is marked.
        Backends without ``capabilities.rerun`` leave this method as is.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot mark a key to run again")

    def take_rerun(self, key: str, token: str, taking: int) -> str | None:
        """While ``token`` holds ``key`` live: take its mark, return its payload; else None.

        The mark is gone once taken (marks written after it make a new one).
        None when ``key`` is not marked, or ``token`` does not hold it live:
        then the mark stays, for the key's next holder. ``taking`` numbers the
        takes of ``token``'s lease: each a larger number than the one before
        (the lock counts 1, 2, 3...), the same take sent again (its reply lost)
        the same number. The storage keeps, per key, the last take of a live
        holder, with its number and answer: a take whose number is not above
        it takes nothing, and answers what that take answered (the same
        number) or None (a smaller one). So a copy arriving late, after a
        later take or a new mark, never takes a mark written after it was
        answered.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot mark a key to run again")

    def rerun_marks(self, key: str | None = None) -> dict[str, datetime]:
        """The keys marked "run once more" (``key``'s alone, if given), each with when
        it was last marked (aware UTC, by the storage's clock). Marks older than
        :data:`RERUN_LIFETIME` are not shown."""
        raise NotImplementedError(f"{type(self).__name__} cannot mark a key to run again")

    def reap_dead_holders(self, alive: Collection[str] = ()) -> Sequence[HeldLock]:
        """End the live leases of this machine whose holders are provably gone; return them.

        The heartbeat of every process that holds a lease calls it every
        ``REAP_INTERVAL`` (see ``django_tasklock.leases.reaping``), so that a
        key a dead process held frees even when the next taker runs on
        another machine, which cannot prove the death. A lease is ended only
        if :func:`~django_tasklock.processes.holder_gone` says True of its
        holder (who ran on this machine), by a deletion bound to its token (a
        successor's lease is never ended), and never a lease a ``min_hold``
        release cut. This default, for backends without the capability
        ``dead_holders``, ends nothing: their leases end by their ttl.

        ``alive``: the names (``Lease.stored_as``) of the leases the calling
        process holds here and keeps refreshing. Their holder is alive, so a
        backend need not look at them (the Redis backend sends no script for
        them); it may also ignore them.
        """
        return []

    def storage_time(self) -> float | None:
        """The storage's clock now, in seconds since the epoch, as one reading; or None.

        The clock by which the storage ends leases (the database server's,
        Redis's ``TIME``). The heartbeat reads it once per tick and compares
        two readings with the time that passed between them on this process's
        clock: a storage clock that stepped forward ends every lease early by
        the step, and the holders' local deadlines are brought forward to
        match (see the protocol page of the docs). None (this default) where
        the storage has no clock apart from this process's, or cannot be read
        cheaply: then no such check is made.
        """
        return None

    def watch(self, key: str, wake: Callable[[], None]) -> AbstractContextManager[Watch]:
        """For a waiter's whole wait: call ``wake`` when ``key`` is released in another process.

        The watch it gives is ``ready`` once a release will be told; until
        then (and always, by default: a storage that tells nobody) the waiter
        polls at its shorter pause. A wake-up may be lost or come in vain: it
        only brings the waiter's next look forward. One connection per
        process for all waiters, never one per waiter (``backends.listening``).
        """
        return unwatched(storage_key(key))

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Let go of connections the calling thread holds (called by idle threads)."""
