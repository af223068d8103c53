"""Waiters woken by a release in another process: one listening connection per storage.

A waiter (``wait=``) of a storage that can tell of releases watches its key
here for the whole wait (:meth:`Listener.watch`). One thread per storage and
process keeps one connection of its own, on which it asks to be told of
releases of the keys watched in the process, never one per waiter; told of
one, it calls the waiters' ``wake``. A watch is ``ready`` once the storage
will tell of that key's release: a waiter that looked at the key while its
watch was ready may sleep its longer pause, since a release after the look
wakes it; one whose watch was not ready yet polls at the shorter pause.

Nothing relies on a wake-up being delivered: a listening connection that
dies, a storage that cannot tell (PostgreSQL behind PgBouncer's transaction
pooling, Redis before 7.0) or a wake-up lost in between costs a waiter no
more than its pause, which never outlasts the holder's lease (see
``locking.waiting``). The thread ends, and its connection closes, as soon as
the last watch ends (not waited for: a waiter that got the key goes on at
once); :func:`wait_closed` waits for that, for a test run about to drop its
database.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import selectors
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator

from django_tasklock import forks

logger = logging.getLogger("django_tasklock")

#: Seconds between two tries to listen after the connection failed.
RETRY_AFTER = 5.0
#: Seconds before a storage found unable to tell of releases is asked again.
DEAF_FOR = 300.0


class Watch:
    """One waiter's watch of one key: ``ready`` once a release of it will be told."""

    __slots__ = ("_listener", "stored")

    def __init__(self, listener: Listener | None, stored: str) -> None:
        self._listener = listener
        self.stored = stored

    @property
    def ready(self) -> bool:
        listener = self._listener
        return listener is not None and listener.is_ready(self.stored)


#: The watch of a storage that tells nobody of releases: never ready.
@contextlib.contextmanager
def unwatched(stored: str) -> Iterator[Watch]:
    yield Watch(None, stored)


class Listener(abc.ABC):
    """The process's listening thread and connection for one storage.

    Subclasses open the connection (:meth:`connect`), ask for the keys
    (:meth:`add`, :meth:`drop`), name what to wait on (:meth:`fileno`), and
    read what came (:meth:`read`); all of it runs on the thread, which alone
    touches the connection. A subclass that hears of a key only once its
    storage confirms sets it ready itself (:meth:`confirmed`).
    """

    #: Whether a key is ready as soon as :meth:`add` returns (else on :meth:`confirmed`).
    ready_on_add = True

    def __init__(self, name: str) -> None:
        self.name = name
        self._mutex = threading.Lock()
        self._wakes: dict[str, list[Callable[[], None]]] = {}
        self._ready: set[str] = set()
        self._thread: threading.Thread | None = None
        self._pipe: tuple[int, int] | None = None
        #: On the thread: releases to tell later, (monotonic time, stored key); see :meth:`defer`.
        self._deferred: list[tuple[float, str]] = []
        #: Until when (monotonic) this storage is known not to tell of releases.
        self._deaf_until = 0.0
        forks.on_fork(self._forget)
        _all.add(self)

    def _forget(self) -> None:
        """In a forked child: the thread and its connection are the parent's."""
        if self._pipe is not None:
            for end in self._pipe:
                with contextlib.suppress(OSError):
                    os.close(end)  # the child's copies
        self._mutex = threading.Lock()
        self._wakes, self._ready, self._thread, self._pipe = {}, set(), None, None
        self._deferred = []

    # -- for waiters -----------------------------------------------------------

    @contextlib.contextmanager
    def watch(self, stored: str, wake: Callable[[], None]) -> Iterator[Watch]:
        """Watch ``stored`` until the block ends; ``wake`` is called for each release heard."""
        with self._mutex:
            try:
                self._start()
            except Exception:  # no pipe or thread to be had (descriptors, shutdown)
                started = False
                logger.warning(
                    "Task lock: no listener for %s; waiters poll.", self.name, exc_info=True
                )
            else:
                started = True
                self._wakes.setdefault(stored, []).append(wake)
        if not started:
            yield Watch(None, stored)
            return
        self._poke()
        try:
            yield Watch(self, stored)
        finally:
            with self._mutex:
                wakes = self._wakes.get(stored)
                if wakes is not None:
                    wakes.remove(wake)
                    if not wakes:
                        del self._wakes[stored]
            self._poke()

    def wait_closed(self, timeout: float) -> bool:
        """Wait until the thread has closed its connection (no watch left); True if it has."""
        deadline = time.monotonic() + timeout
        while True:
            thread = self._thread
            if thread is None:
                return True
            if time.monotonic() >= deadline:
                return False
            thread.join(min(0.05, max(0.0, deadline - time.monotonic())))

    def is_ready(self, stored: str) -> bool:
        return stored in self._ready

    def watched(self) -> int:
        """How many keys this process watches now."""
        return len(self._wakes)

    def _start(self) -> None:
        """Under the mutex: the thread, if it is not running."""
        if self._thread is not None:
            return
        pipe = os.pipe()
        try:
            for end in pipe:
                os.set_blocking(end, False)
            thread = threading.Thread(
                target=self._run,
                args=(pipe,),
                name=f"tasklock-listener-{self.name}",
                daemon=True,
            )
            thread.start()
        except BaseException:
            for end in pipe:
                os.close(end)
            raise
        self._thread, self._pipe = thread, pipe

    def _poke(self) -> None:
        # Under the mutex: the thread closes its pipe only once it is no longer
        # named here (a descriptor closed may be reused by anything).
        with self._mutex:
            if self._pipe is not None:
                with contextlib.suppress(OSError):  # full: a poke is pending already
                    os.write(self._pipe[1], b"\0")

    # -- on the thread -----------------------------------------------------------

    def _run(self, pipe: tuple[int, int]) -> None:
        try:
            self._listen(pipe[0])
        finally:
            with self._mutex:
                if self._pipe is pipe:  # ended by an error: no longer running
                    self._thread, self._pipe = None, None
                    self._ready.clear()
            for end in pipe:
                os.close(end)

    def _listen(self, poked: int) -> None:
        self._deferred = []  # an earlier thread's: its waiters are gone
        listening: set[str] = set()
        connected = False
        retry_at = self._deaf_until
        try:
            while True:
                with self._mutex:
                    wanted = set(self._wakes)
                    # Ready only while watched: a key dropped and watched again is
                    # not ready until the storage is asked for it again.
                    self._ready.intersection_update(wanted)
                if not wanted:
                    if connected:  # closed before the thread is said to be gone
                        connected = False
                        listening.clear()
                        self._quietly_close()
                    with self._mutex:
                        if not self._wakes:
                            self._thread, self._pipe = None, None
                            self._ready.clear()
                            return
                    continue
                try:
                    if not connected and time.monotonic() >= retry_at:
                        connected = self.connect()
                        if not connected:
                            retry_at = self._deaf_until = time.monotonic() + DEAF_FOR
                            logger.info(
                                "Task lock: %s does not tell of releases; its waiters poll.",
                                self.name,
                            )
                    if connected:
                        self._follow(wanted, listening)
                        # What came while it asked for keys is read now, not after a wait.
                        self._tell(self.read())
                    # Not select(): descriptors above 1023 too. Made anew each time: a
                    # client that reconnected by itself has another socket.
                    with selectors.DefaultSelector() as selector:
                        selector.register(poked, selectors.EVENT_READ)
                        if connected:
                            selector.register(self.fileno(), selectors.EVENT_READ)
                        selector.select(self._until_deferred(1.0))
                    with contextlib.suppress(OSError):
                        os.read(poked, 4096)
                    if connected:
                        self._tell(self.read())
                    self._tell(self._due())
                except Exception:
                    logger.warning(
                        "Task lock: the listener of %s lost its connection; waiters poll "
                        "until it is back.",
                        self.name,
                        exc_info=True,
                    )
                    self._ready.clear()
                    listening.clear()
                    connected = False
                    retry_at = time.monotonic() + RETRY_AFTER
                    self._quietly_close()
        finally:
            if connected:
                self._quietly_close()

    def _quietly_close(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _follow(self, wanted: set[str], listening: set[str]) -> None:
        gone = listening - wanted
        if gone:
            self.drop(gone)
            listening.difference_update(gone)
        new = wanted - listening
        if new:
            self.add(new)
            listening.update(new)
            if self.ready_on_add:
                with self._mutex:
                    self._ready.update(key for key in new if key in self._wakes)

    def defer(self, stored: str, seconds: float) -> None:
        """On the thread: tell of ``stored``'s release only ``seconds`` from now.

        For a release that named another process's waiters to look first (see
        ``backends.database.notifications``): this process's waiters look
        later, when that one most likely holds the key already.
        """
        self._deferred.append((time.monotonic() + seconds, stored))

    def _until_deferred(self, longest: float) -> float:
        if not self._deferred:
            return longest
        return max(0.0, min(longest, min(due for due, _ in self._deferred) - time.monotonic()))

    def _due(self) -> list[str]:
        if not self._deferred:
            return []
        now = time.monotonic()
        due = [stored for at, stored in self._deferred if at <= now]
        self._deferred = [(at, stored) for at, stored in self._deferred if at > now]
        return due

    def confirmed(self, stored: str) -> None:
        """On the thread: the storage confirmed that it tells of ``stored``'s releases."""
        with self._mutex:
            if stored in self._wakes:
                self._ready.add(stored)

    def _tell(self, released: Iterable[str]) -> None:
        for stored in released:
            with self._mutex:
                wakes = list(self._wakes.get(stored, ()))
            for wake in wakes:
                wake()

    # -- the storage's part --------------------------------------------------------

    @abc.abstractmethod
    def connect(self) -> bool:
        """Open the connection; False if this storage cannot tell of releases (now)."""

    @abc.abstractmethod
    def add(self, stored: Iterable[str]) -> None:
        """Ask to be told of releases of these keys too."""

    @abc.abstractmethod
    def drop(self, stored: Iterable[str]) -> None:
        """No longer ask for these keys."""

    @abc.abstractmethod
    def fileno(self) -> int:
        """The connection's socket, readable when something came."""

    @abc.abstractmethod
    def read(self) -> Iterable[str]:
        """The keys released since the last read (without waiting)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection."""


_all: weakref.WeakSet[Listener] = weakref.WeakSet()


def wait_closed(timeout: float = 5.0) -> bool:
    """Wait until every listener of this process has closed its connection; True if all have.

    For a test run about to drop its database: a listening connection closes
    as soon as its last waiter stops waiting, but on its own thread.
    """
    deadline = time.monotonic() + timeout
    return all(
        listener.wait_closed(max(0.0, deadline - time.monotonic())) for listener in list(_all)
    )
