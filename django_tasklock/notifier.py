"""Where receivers and log handlers run for the heartbeat and the deadline watcher.

Neither of those threads may wait for code it does not own: a receiver that
sends an alert, or a log handler writing to a slow network, would stop every
refresh or every declaration of the process. So what they log and send is
queued to one more daemon thread per process, the notifier, which runs it in
order. Log records are made on the thread that logs (its name, time and line
stay true); only the handlers run on the notifier. On any other thread (the
caller's), :func:`log` and :func:`run` run at once, as before.

A daemon thread is abandoned when the interpreter exits, mid-call: a job that
stops on its loss (``LockLost``) and ends its process would cut its
``lock_lost`` receivers short. So the exit waits, :data:`DRAIN_TIMEOUT` at
most, until nothing is queued or running any more (see :meth:`Notifier.drain`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django_tasklock import forks

logger = logging.getLogger("django_tasklock")

#: Seconds the interpreter's exit waits, at most, for the notifier to finish the
#: call it is running, what is queued and what gets queued meanwhile (the
#: heartbeat and the deadline watcher still run then). Past it the exit goes
#: on: a receiver or log handler still running is abandoned mid-call with the
#: daemon thread, and what is queued behind it never runs. A constant, not a
#: setting: it only bounds a receiver that hangs.
DRAIN_TIMEOUT = 5.0

_ours = threading.local()


def mark_background() -> None:
    """The calling thread is the heartbeat or the deadline watcher: never run handlers on it."""
    _ours.background = True


def on_background_thread() -> bool:
    return getattr(_ours, "background", False)


class Notifier:
    """One daemon thread running queued calls in order; started on first use."""

    def __init__(self) -> None:
        # Kept through a fork: the child inherits the parent's exit hook.
        self._exit_hooked = False
        self._start_empty()

    def _start_empty(self) -> None:
        """A notifier with nothing queued and no thread (also a forked child's: the
        parent's queue, thread and count stay the parent's, so the child's exit
        never waits for them)."""
        self._queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # Calls queued and not finished, plus declarations about to queue one
        # (:meth:`pending`); the exit waits on ``_idle`` for it to reach 0.
        self._unfinished = 0
        self._idle = threading.Condition(threading.Lock())

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the notifier thread, after what was queued before."""
        with self._idle:
            self._unfinished += 1
        self._queue.put((fn, args))
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="django-tasklock-notifier", daemon=True
                    )
                    self._thread.start()
                    self._hook_exit()

    def _run(self) -> None:
        while True:
            fn, args = self._queue.get()
            try:
                fn(*args)
            except BaseException:  # even SystemExit from a receiver: the thread goes on
                logger.exception("A django-tasklock notification failed.")
            finally:
                self._finished()

    def _finished(self) -> None:
        with self._idle:
            self._unfinished -= 1
            if not self._unfinished:
                self._idle.notify_all()

    @contextlib.contextmanager
    def pending(self) -> Iterator[None]:
        """Count the block as unfinished work: the exit waits for it as for a queued call."""
        with self._idle:
            self._unfinished += 1
        self._hook_exit()  # the first announcement may come from inside the block
        try:
            yield
        finally:
            self._finished()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or running, :data:`DRAIN_TIMEOUT` at most.

        Calls queued meanwhile are waited for too, within the same time. True
        if the notifier fell idle; False at the bound (a call still running is
        left to run, abandoned if the process then ends). Never run on the
        notifier thread itself (that would wait for itself): False at once.
        """
        if threading.current_thread() is self._thread:
            return False
        deadline = time.monotonic() + (DRAIN_TIMEOUT if timeout is None else timeout)
        with self._idle:
            while self._unfinished:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _hook_exit(self) -> None:
        """Have the interpreter's exit drain the notifier (once, when it is first needed).

        ``atexit`` rather than ``threading._register_atexit``. Both run on the
        main thread while daemon threads still run (they are abandoned only
        after). But ``atexit`` functions run after the non-daemon threads were
        joined (``ThreadPoolExecutor`` workers too, which their own
        ``_register_atexit`` hook joins), so the loss of a job on one of those
        threads, announced as it ends, is drained too; ``_register_atexit``
        functions run before that join, it is CPython's internal API, and it
        refuses a function once the exit has begun (a notifier first started
        then, by a non-daemon thread, would never be drained). The drain starts
        no thread, so it does not mind the Python versions that refuse new
        threads at exit. Functions registered later (the user's) run before it;
        ``logging.shutdown``, registered at ``import logging``, after it, with
        the handlers still open. A process ended by ``os._exit()`` (a forked
        ``multiprocessing`` or Celery prefork child) or killed by a signal runs
        no exit function: no drain there.
        """
        with self._idle:
            if self._exit_hooked:
                return
            self._exit_hooked = True
        atexit.register(self.drain)


_notifier = Notifier()
forks.on_fork(_notifier._start_empty)


def notifier() -> Notifier:
    """The process's notifier."""
    return _notifier


def pending() -> contextlib.AbstractContextManager[None]:
    """A block the exit waits for as for a queued call: a declaration of loss.

    ``lost`` turns True inside it, before the announcement is queued (or run),
    and a job that sees it may end its process at once.
    """
    return _notifier.pending()


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
