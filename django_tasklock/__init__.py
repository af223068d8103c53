"""django-tasklock: "at most one of these at a time" for Django background work."""

from __future__ import annotations

from django_tasklock import reasons
from django_tasklock.api.decorators import exclusive
from django_tasklock.api.leadership import Leadership
from django_tasklock.api.service import (
    LockResult,
    TaskLockService,
    arun_exclusive,
    lock,
    run_exclusive,
)
from django_tasklock.api.sigterm import release_on_sigterm
from django_tasklock.backends.base import BaseBackend, HeldLock, Holder
from django_tasklock.exceptions import (
    AlreadyEnqueued,
    LimitMismatch,
    LockLost,
    LockNotAcquired,
    ReplicationNotConfirmed,
    RetryUnavailable,
    SyncLockInAsyncContext,
    TaskLockError,
)
from django_tasklock.locking.lock import Lock, current_lock
from django_tasklock.locking.loss import checkpoint
from django_tasklock.locking.options import LockKwargs
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
    "LimitMismatch",
    "Lock",
    "LockKwargs",
    "LockLost",
    "LockNotAcquired",
    "LockResult",
    "ReplicationNotConfirmed",
    "RetryUnavailable",
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
    "release_on_sigterm",
    "run_exclusive",
]
