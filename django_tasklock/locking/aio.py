"""asyncio: the lock's synchronous steps run off the loop; a body cancelled on a loss."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async

from django_tasklock.exceptions import SyncLockInAsyncContext

if TYPE_CHECKING:
    from django_tasklock.leases.lease import Lease

T = TypeVar("T")

#: Tasks that must finish even if whoever started them is cancelled.
_background: set[asyncio.Future[Any]] = set()


def keep(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run ``coro`` as a task referenced until it ends (the loop keeps only weak ones)."""
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


def off_loop(fn: Callable[..., T]) -> Callable[..., Coroutine[Any, Any, T]]:
    """``fn`` run in a worker thread, the one Django's own async ORM calls use.

    ``thread_sensitive=True`` runs it where ``sync_to_async`` runs Django's
    ORM (the request's thread under ASGI, else one shared thread), so the
    database backend uses the connection Django manages there and closes by
    its usual rules (``CONN_MAX_AGE``, ``close_old_connections``), never a
    connection per pool thread that nothing would close.
    """
    return sync_to_async(fn, thread_sensitive=True)


class LossCanceller:
    """Cancels one asyncio task at its lease's declared loss (``cancel_on_loss=True``).

    The loss is declared on whichever thread notices it first (the
    heartbeat's, the deadline watcher's, or one reading ``lost``); that thread
    only schedules the cancellation on the task's loop, which does it at the
    task's next ``await``. :meth:`settle` then tells this cancellation from
    one that came from outside, which must still propagate as
    ``CancelledError``.
    """

    #: The message of our cancellation (how it is told apart on Python 3.10).
    MESSAGE = "django-tasklock: the lease was lost"

    def __init__(self, lease: Lease, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._loop = task.get_loop()
        self._armed = True
        self.cancelled = False
        lease.on_loss(self._declared)

    def _declared(self, lease: Lease) -> None:
        """On the declaring thread: quick, never blocking."""
        with contextlib.suppress(RuntimeError):  # a closed loop has no task left to cancel
            self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self._armed and not self._task.done():
            self.cancelled = True
            self._task.cancel(self.MESSAGE)

    def settle(self, error: BaseException | None) -> bool:
        """Disarm; True if the body ended because of our cancellation (raise ``LockLost``).

        Called on the task, when the body has ended with ``error`` (or None).
        From now on a loss cancels nothing. On Python 3.11+ our cancellation
        is withdrawn (``Task.uncancel``), so ``asyncio.timeout`` and task
        groups around the lock see only cancellations from outside; if one of
        those is pending too, it wins and False is returned.
        """
        self._armed = False
        if not self.cancelled:
            return False
        uncancel = getattr(self._task, "uncancel", None)
        if uncancel is not None:
            return bool(uncancel() == 0)
        # Python 3.10: a cancellation from outside replaces our message.
        if isinstance(error, asyncio.CancelledError):  # pragma: no cover - Python 3.10
            return error.args == (self.MESSAGE,)
        return True  # pragma: no cover - Python 3.10


def refuse_event_loop(key: str, call: str, twin: str) -> None:
    """Raise :class:`SyncLockInAsyncContext` if this thread runs an event loop.

    Django's own test, so that the lock behaves alike on every backend: a
    sync view under ASGI runs in a worker thread, without a loop, and passes.
    """
    # asyncio's own None-or-loop (exported by asyncio.events): get_running_loop()
    # would raise and catch a RuntimeError on every lock taken outside async code.
    if asyncio._get_running_loop() is None:
        return
    if os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        return
    raise SyncLockInAsyncContext(
        f"Task lock {key!r}: {call} was called inside async code, where it would block "
        f"the event loop; use {twin} there instead."
    )
