"""Running the lock's synchronous steps from asyncio, without blocking the loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from django_tasklock.exceptions import SyncLockInAsyncContext

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


def refuse_event_loop(key: str, call: str, twin: str) -> None:
    """Raise :class:`SyncLockInAsyncContext` if this thread runs an event loop.

    Django's own test, so that the lock behaves alike on every backend: a
    sync view under ASGI runs in a worker thread, without a loop, and passes.
    """
    if os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise SyncLockInAsyncContext(
        f"Task lock {key!r}: {call} was called inside async code, where it would block "
        f"the event loop; use {twin} there instead."
    )
