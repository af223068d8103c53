"""What a forked child forgets of its parent: the state made per process.

A child of ``os.fork()`` runs the hooks of ``os.register_at_fork``. A fork
that runs no Python hook (uWSGI's preforking without
``py-call-osafterfork``, a C extension's ``fork()``) does not: the child
would believe it has its parent's threads (the heartbeat, the notifier),
its parent's name in its tokens, and the parent's leases to keep alive.
:func:`on_fork` registers a hook for both: with ``os.register_at_fork``,
and run by :func:`this_pid` when it first sees a pid that is not the one it
saw last, which every new token asks (so before a child's first lock).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

logger = logging.getLogger("django_tasklock")

_hooks: list[Callable[[], None]] = []
_pid = os.getpid()  # the process the hooks last ran for (or this module was loaded in)
_running = 0  # the pid whose hooks are running now (a hook that asks this_pid() again)
#: One gate per pid, made in that process: none can be held by a thread the fork left behind.
_gates: dict[int, threading.RLock] = {}


def on_fork(hook: Callable[[], None]) -> None:
    """Run ``hook`` in a forked child, before it takes a lock, whatever forked it."""
    _hooks.append(hook)
    os.register_at_fork(after_in_child=hook)


def this_pid() -> int:
    """``os.getpid()``; first in a child forked without Python's hooks, those run.

    The other threads of such a child that ask meanwhile wait until every
    hook has run; a hook that fails is logged, and the others run.
    """
    pid = os.getpid()
    if pid != _pid:
        _run_hooks(pid)
    return pid


def _run_hooks(pid: int) -> None:
    global _pid, _running
    with _gates.setdefault(pid, threading.RLock()):
        if pid == _pid or _running == pid:  # done by another thread, or asked by a hook
            return
        _running = pid
        try:
            for hook in _hooks:
                try:
                    hook()
                except Exception:
                    logger.exception("django-tasklock: a fork hook failed in process %s", pid)
        finally:
            _pid = pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()  # os.fork(): the hooks run by themselves


os.register_at_fork(after_in_child=_forked)
