"""django-tasklock: "at most one of these at a time" for Django background work."""

from __future__ import annotations

from django_tasklock import reasons
from django_tasklock.backends.base import BaseBackend, HeldLock, Holder
from django_tasklock.decorators import exclusive
from django_tasklock.exceptions import (
    AlreadyEnqueued,
    LockLost,
    LockNotAcquired,
    ReplicationNotConfirmed,
    SyncLockInAsyncContext,
    TaskLockError,
)
from django_tasklock.leadership import Leadership
from django_tasklock.lock import Lock
from django_tasklock.loss import checkpoint, current_lock
from django_tasklock.options import LockKwargs
from django_tasklock.service import (
    LockResult,
    TaskLockService,
    arun_exclusive,
    lock,
    run_exclusive,
)
from django_tasklock.signals import (
    lock_acquired,
    lock_lost,
    lock_released,
    lock_skipped,
    lock_stalled,
)

__all__ = [
    "AlreadyEnqueued",
    "BaseBackend",
    "HeldLock",
    "Holder",
    "Leadership",
    "Lock",
    "LockKwargs",
    "LockLost",
    "LockNotAcquired",
    "LockResult",
    "ReplicationNotConfirmed",
    "SyncLockInAsyncContext",
    "TaskLockError",
    "TaskLockService",
    "arun_exclusive",
    "checkpoint",
    "current_lock",
    "exclusive",
    "lock",
    "lock_acquired",
    "lock_lost",
    "lock_released",
    "lock_skipped",
    "lock_stalled",
    "reasons",
    "run_exclusive",
]
