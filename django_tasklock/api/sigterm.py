"""SIGTERM that lets ``with`` blocks end: for plain scripts and management commands.

Python's default SIGTERM (what ``kill``, systemd, Docker and Kubernetes send)
ends the process at once: no ``finally`` runs, no ``with`` block exits, and
every lease the process holds stays in the storage. On the holder's own
machine the next acquisition proves the process gone and takes the key over
(and the heartbeat of any process there holding a lock reaps it), but a taker
on another machine waits for the ttl.

:func:`release_on_sigterm`, called once at the start of a script or a
command's ``handle()``, makes SIGTERM raise ``SystemExit`` in the main
thread, as Ctrl-C raises ``KeyboardInterrupt``: the work's ``finally`` blocks
run and its locks are released on the way out. The library installs no
handler by itself: task frameworks' workers (Celery, RQ, Huey, Dramatiq,
django-q2) handle SIGTERM their own way, and the pool processes some of them
fork must die of it as they expect. So it is one call, where you choose it,
and it never replaces a handler that is already there.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


def release_on_sigterm() -> bool:
    """Make SIGTERM raise ``SystemExit(143)`` in the main thread, so that locks are released.

    Returns True when the handler is installed (now or before), False when
    SIGTERM already has a handler of someone else's (a framework's, the
    project's, or ``SIG_IGN``), which is left as it is. A second SIGTERM,
    while the first unwinds, ends the process at once (the default again).
    Locks held by other threads: a non-daemon thread runs to its end (Python
    waits for it at exit) and releases its own; a daemon thread's are left,
    for the next acquisition on this machine to take over.

    Raises:
        RuntimeError: not called from the main thread (Python sets signal
            handlers there only).
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "release_on_sigterm() must be called from the main thread: Python installs "
            "signal handlers there only"
        )
    current = signal.getsignal(signal.SIGTERM)
    if current is _exit:
        return True
    if current is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _exit)
    return True


def _exit(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM: at once
    raise SystemExit(128 + signum)
