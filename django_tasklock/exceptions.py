"""Exceptions raised by django-tasklock."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import SynchronousOnlyOperation

if TYPE_CHECKING:
    from django_tasklock.holders import HeldLock


class TaskLockError(Exception):
    """Base class of django-tasklock's own errors."""


class LockNotAcquired(TaskLockError):
    """Another holder kept the key for as long as the caller was willing to wait.

    Raised by ``Lock.acquire()`` and ``with lock:``; ``key`` is the caller's key.
    """

    def __init__(self, key: str, wait: timedelta | None = None) -> None:
        self.key = key
        self.wait = wait
        waited = f" within {wait}" if wait else ""
        super().__init__(f"Task lock {key!r} was not acquired{waited}: another worker holds it.")

    def __reduce__(self) -> tuple[type[LockNotAcquired], tuple[str, timedelta | None]]:
        return type(self), (self.key, self.wait)


class LockLost(TaskLockError):
    """The lease was lost while the work held it: raised when the work asked to be stopped.

    Raised by ``Lock.raise_if_lost()``, by ``checkpoint()`` under
    ``@exclusive(on_lost="raise")``, and instead of the ``CancelledError`` of a
    body cancelled by ``cancel_on_loss=True``. ``key`` is the caller's key;
    ``reason`` says why the lease was lost (``"expired"``, ``"taken"``,
    ``"released_by_operator"``, ``"max_lifetime"``), or is None when the
    loss came with no reason.
    """

    def __init__(self, key: str, reason: str | None = None) -> None:
        self.key = key
        self.reason = reason
        why = f" ({reason})" if reason else ""
        super().__init__(f"Task lock {key!r} was lost{why}: another worker may hold it now.")

    def __reduce__(self) -> tuple[type[LockLost], tuple[str, str | None]]:
        return type(self), (self.key, self.reason)


class ReplicationNotConfirmed(TaskLockError):
    """Fewer replicas than asked confirmed a lease in time: the acquisition failed.

    Raised by the Redis backend's acquisition (and fencing) when
    ``TASKLOCK_REDIS_MIN_REPLICAS`` (``RedisBackend(min_replicas=...)``) is set
    and ``WAIT`` counted fewer than ``wanted`` replicas within the timeout. The
    lease was released by its token (``released``; if that failed too, it
    expires after its ``ttl``). It is an error of the storage, never "held by
    someone else": no other worker is known to hold the key. ``key`` is the
    caller's key; ``confirmed`` the replicas that did confirm.
    """

    def __init__(
        self, key: str, wanted: int, confirmed: int, timeout: timedelta, released: bool = True
    ) -> None:
        self.key = key
        self.wanted = wanted
        self.confirmed = confirmed
        self.timeout = timeout
        self.released = released
        ended = "it was released" if released else "releasing it failed: it expires after its ttl"
        super().__init__(
            f"Task lock {key!r} was not acquired: {confirmed} of the {wanted} replica(s) "
            f"asked for (TASKLOCK_REDIS_MIN_REPLICAS) confirmed the lease within {timeout}; "
            f"{ended}."
        )

    def __reduce__(
        self,
    ) -> tuple[type[ReplicationNotConfirmed], tuple[str, int, int, timedelta, bool]]:
        return type(self), (self.key, self.wanted, self.confirmed, self.timeout, self.released)


class SyncLockInAsyncContext(TaskLockError, SynchronousOnlyOperation):
    """The sync API (``with lock``, ``acquire()``, ``run_exclusive``) called on an event loop.

    It would block the loop while it waits for the storage (and on the
    database backend Django refuses its queries there), so it is refused on
    every backend before anything is written; the message names the async
    twin. It is Django's ``SynchronousOnlyOperation``, the error Django's own
    sync-only calls raise there, and a ``TaskLockError``. As for Django, the
    ``DJANGO_ALLOW_ASYNC_UNSAFE`` environment variable lifts the check.
    """


class AlreadyEnqueued(TaskLockError):
    """An enqueue with ``unique_on=`` was refused: an identical task is queued or running.

    ``key`` is the unique key the task's arguments gave; ``held`` is who holds
    it (the process that enqueued it, while it waits; host and pid) with its
    expiry, or None when the key changed hands at each look.
    """

    def __init__(self, key: str, held: HeldLock | None = None) -> None:
        self.key = key
        self.held = held
        by = ""
        if held is not None:
            by = f" (held by {held.holder} until {held.expires_at:%Y-%m-%d %H:%M:%S} UTC)"
        super().__init__(f"Not enqueued: an identical task holds unique key {key!r}{by}.")

    def __reduce__(self) -> tuple[type[AlreadyEnqueued], tuple[str, HeldLock | None]]:
        return type(self), (self.key, self.held)


class LimitMismatch(TaskLockError, ValueError):
    """A key was asked for with a ``limit`` other than the one its live permits were taken with.

    Every caller of one key must agree on how many may hold it at once (a
    mutex is ``limit=1``): a call that disagrees with the permits held now is
    refused rather than silently mixed, and nothing is written. ``held`` is
    the limit of the live permits (1: a mutex's lease), ``asked`` this call's.
    """

    def __init__(self, key: str, *, held: int, asked: int) -> None:
        self.key = key
        self.held = held
        self.asked = asked
        super().__init__(
            f"limit={asked} refused for key {key!r}: it is held now with limit={held}; "
            "every caller of one key must give the same limit"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return _limit_mismatch, (self.key, self.held, self.asked)


def _limit_mismatch(key: str, held: int, asked: int) -> LimitMismatch:
    return LimitMismatch(key, held=held, asked=asked)


class RetryUnavailable(TaskLockError, TypeError):
    """``on_locked="retry"`` where no task of a framework with a retry of its own runs.

    Raised when the key is held (after the skip is reported): the function was
    called directly, or by a framework without retries (Django's tasks,
    django-q2). ``key`` is the key that was held.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"task lock {key!r} was held and on_locked='retry' asks the running task's "
            "framework to retry it, but no task of Celery, RQ (2.1 or later), Dramatiq or "
            "Huey runs here (Django's tasks and django-q2 have no retry of their own): "
            "use on_locked='rerun', wait=, or the default skip"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return RetryUnavailable, (self.key,)
