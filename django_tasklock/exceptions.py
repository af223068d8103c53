"""Exceptions raised by django-tasklock."""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import SynchronousOnlyOperation


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


class SyncLockInAsyncContext(TaskLockError, SynchronousOnlyOperation):
    """The sync API (``with lock``, ``acquire()``, ``run_exclusive``) called on an event loop.

    It would block the loop while it waits for the storage (and on the
    database backend Django refuses its queries there), so it is refused on
    every backend before anything is written; the message names the async
    twin. It is Django's ``SynchronousOnlyOperation``, the error Django's own
    sync-only calls raise there, and a ``TaskLockError``. As for Django, the
    ``DJANGO_ALLOW_ASYNC_UNSAFE`` environment variable lifts the check.
    """
