"""Where receivers and log handlers run for the heartbeat and the deadline watcher.

Neither of those threads may wait for code it does not own: a receiver that
sends an alert, or a log handler writing to a slow network, would stop every
refresh or every declaration of the process. So what they log and send is
queued to one more daemon thread per process, the notifier, which runs it in
order. Log records are made on the thread that logs (its name, time and line
stay true); only the handlers run on the notifier. On any other thread (the
caller's), :func:`log` and :func:`send` run at once, as before.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("django_tasklock")

_ours = threading.local()


def mark_background() -> None:
    """The calling thread is the heartbeat or the deadline watcher: never run handlers on it."""
    _ours.background = True


def on_background_thread() -> bool:
    return getattr(_ours, "background", False)


class Notifier:
    """One daemon thread running queued calls in order; started on first use."""

    def __init__(self) -> None:
        self._start_empty()

    def _start_empty(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the notifier thread, after what was queued before."""
        self._queue.put((fn, args))
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="django-tasklock-notifier", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while True:
            fn, args = self._queue.get()
            try:
                fn(*args)
            except BaseException:  # even SystemExit from a receiver: the thread goes on
                logger.exception("A django-tasklock notification failed.")


_notifier = Notifier()
os.register_at_fork(after_in_child=_notifier._start_empty)


def notifier() -> Notifier:
    """The process's notifier."""
    return _notifier


def log(level: int, msg: str, *args: Any, exc_info: Any = None) -> None:
    """``logger.log``; from the heartbeat or the watcher, handled on the notifier thread."""
    if not on_background_thread():
        logger.log(level, msg, *args, exc_info=exc_info, stacklevel=2)
        return
    if not logger.isEnabledFor(level):
        return
    if isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    elif exc_info is True:
        exc_info = sys.exc_info()
    fn, lno, func, _ = logger.findCaller(stacklevel=2)
    record = logger.makeRecord(logger.name, level, fn, lno, msg, args, exc_info, func)
    _notifier.submit(logger.handle, record)


def run(fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)`` now, or on the notifier thread when called from the heartbeat or watcher."""
    if on_background_thread():
        _notifier.submit(fn, *args)
    else:
        fn(*args)
