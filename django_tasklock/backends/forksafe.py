"""A lock that a forked child gets free, whatever the parent's threads were doing.

``os.fork()`` copies a ``threading.Lock`` in whatever state it was: held by
a thread that does not exist in the child, it stays held for ever, and the
child's first use of the backend hangs. Celery's prefork pool and Gunicorn
fork from parents that may be using a backend in another thread.
"""

from __future__ import annotations

import threading
import weakref
from types import TracebackType

from django_tasklock import forks

_every_lock: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


class ForkSafeLock:
    """A ``threading.Lock`` (as a context manager) that is new and free in a forked child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _every_lock.add(self)

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.__exit__(exc_type, exc, traceback)

    def _renew(self) -> None:
        self._lock = threading.Lock()


def _renew_all() -> None:
    for lock in list(_every_lock):
        lock._renew()


forks.on_fork(_renew_all)
