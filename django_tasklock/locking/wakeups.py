"""Waiters of this process woken by a release of their key in this process.

A waiter (``wait=``) sleeps between two looks at a held key (``waiting``);
when a lock of this process releases that key, the waiters of the same key
in this process look again at once instead of sleeping their pause out.
A waiter is listed for its whole wait, not only while it sleeps, so that a
release between its look and its sleep is not missed. Threads wait on an
``Event`` of their own, asyncio tasks on an ``asyncio.Event`` set through
their loop. A wake-up only brings the next
look forward: the pause stays the bound (a waiter of another process, or
one woken in vain, looks again when its pause ends), so nothing relies on
it being delivered. Keys are the callers' keys, whatever the storage: a
release of the same key in another storage wakes the waiter for one look.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from django_tasklock import forks

#: How to wake one waiter: a thread's event, or a task's with its loop.
Waiter = threading.Event | tuple[asyncio.AbstractEventLoop, asyncio.Event]

_mutex = threading.Lock()
#: Per key, its waiters in this process.
_waiters: dict[str, list[Waiter]] = {}


def _forget() -> None:
    """In a forked child: no waiter of the parent's is here; the mutex may have been held."""
    global _mutex, _waiters
    _mutex, _waiters = threading.Lock(), {}


forks.on_fork(_forget)


@contextlib.contextmanager
def _listed(key: str, waiter: Waiter) -> Iterator[None]:
    with _mutex:
        _waiters.setdefault(key, []).append(waiter)
    try:
        yield
    finally:
        with _mutex:
            listed = _waiters.get(key)
            if listed is not None:
                listed.remove(waiter)
                if not listed:
                    del _waiters[key]


@contextlib.contextmanager
def listening(key: str) -> Iterator[threading.Event]:
    """For a thread's whole wait: an event set by every release of ``key`` here.

    Cleared before each look at the key and waited on for the pause after it,
    so that a release between the two is not missed.
    """
    woken = threading.Event()
    with _listed(key, woken):
        yield woken


@contextlib.contextmanager
def alistening(key: str) -> Iterator[asyncio.Event]:
    """:func:`listening` for an asyncio task (its event is set through its loop)."""
    woken = asyncio.Event()
    with _listed(key, (asyncio.get_running_loop(), woken)):
        yield woken


async def asleep(woken: asyncio.Event, seconds: float) -> bool:
    """Await ``woken`` for ``seconds`` at most; True if it was set.

    Not ``asyncio.wait_for``: on Python 3.10 and 3.11 it returns normally when
    the caller is cancelled as the event is set, and the cancellation is lost.
    """
    waiter = asyncio.ensure_future(woken.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=seconds)
        return bool(done)
    finally:
        waiter.cancel()


def released(key: str) -> None:
    """``key`` was released by a lock of this process: its waiters here look again."""
    if not _waiters:  # nobody waits in this process: the release's usual case
        return
    with _mutex:
        waiters = list(_waiters.get(key, ()))
    for waiter in waiters:
        if isinstance(waiter, threading.Event):
            waiter.set()
        else:
            loop, event = waiter
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(event.set)
