"""The deadline watcher: one daemon thread declaring each lease lost at its local deadline.

A lease is known live only until its ``valid_until``: when its last confirmed
refresh (or its acquisition) was sent, plus ``ttl``, or acquisition +
``max_lifetime``. Past it the storage may have let the lease go and another
worker may hold the key, whatever the heartbeat is doing: waiting for a
storage that stopped answering, between two attempts after a refused
connection, or idle. So this thread sleeps until the earliest ``valid_until``
of the process's leases and declares each lease whose deadline has passed
(``reason`` ``"expired"`` or ``"max_lifetime"``). It sleeps in slices of at
most ``SLICE`` seconds: its sleep runs on the monotonic clock, which stops
while the machine is suspended, and the deadlines on :func:`clock`, which does
not, so a resume past a deadline is noticed within a slice. It never calls the storage,
a receiver or a log handler: the warning and ``lock_lost`` go to the
notifier thread (see ``notifier``), so nothing but the CPU delays it.

The heap holds one entry per lease, keyed by the ``valid_until`` it had when
pushed. A confirmed refresh only moves ``valid_until`` later, and changes
nothing here: an entry found early is pushed again at the lease's new
deadline. Only a new lease whose deadline is earlier than the thread's wake-up
wakes it. Released leases leave when they come due, or all at once when they
are half the heap. Once the heap is empty the thread looks again after one
slice before it sleeps until a lease comes, so that a loop of short locks does
not wake it for every one.

``Lease.lost`` applies the same rule by itself (it compares the clock), so a
reader never waits for this thread; the thread is there for the leases
nobody reads, and for the signal.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
from typing import TYPE_CHECKING

from django_tasklock import forks
from django_tasklock.leases.lease import clock
from django_tasklock.notifier import log, mark_background

if TYPE_CHECKING:
    from django_tasklock.leases.lease import Lease

# Released leases tolerated in the heap before it is compacted.
_COMPACT_AFTER = 64
# The longest sleep while leases are watched: the sleep runs on the monotonic
# clock, which stops during a suspend, so a resume is noticed within this.
SLICE = 1.0


class DeadlineWatcher:
    """Declares each lease lost at its local deadline; one thread per process, at most."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._start_empty()

    def _start_empty(self) -> None:
        # Taken directly where nothing waits (as for the heartbeat's, see there).
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._heap: list[tuple[float, int, Lease]] = []
        self._thread: threading.Thread | None = None
        self._running = False  # the thread's liveness, read per lease without is_alive()
        self._wake_at = math.inf
        self._closed = 0  # released leases still in the heap

    def add(self, lease: Lease) -> None:
        """Watch ``lease`` until it is released or declared lost."""
        with self._mutex:
            when = lease.valid_until
            heapq.heappush(self._heap, (when, next(self._seq), lease))
            if not self._running:
                self._thread = threading.Thread(
                    target=self._run, name="django-tasklock-deadlines", daemon=True
                )
                self._running = True
                try:
                    self._thread.start()
                except BaseException:  # no thread (e.g. none can be started now)
                    self._running = False
                    raise
            elif when < self._wake_at:
                self._cond.notify()

    def removed(self) -> None:
        """A watched lease was released (``closed``): compact the heap when it is half such."""
        with self._mutex:
            self._closed += 1
            if self._closed > _COMPACT_AFTER and 2 * self._closed > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].closed]
                heapq.heapify(self._heap)
                self._closed = 0

    def _after_fork(self) -> None:
        # The parent's leases are the parent's; the condition may have been held mid-fork.
        self._start_empty()

    def _next_due(self) -> list[Lease]:
        """Wait for the earliest deadline; return the leases whose deadline has passed."""
        with self._cond:
            quiet = False  # found nothing to watch once already
            while True:
                now = clock()
                due: list[Lease] = []
                while self._heap:
                    when, _, lease = self._heap[0]
                    if lease.closed or lease.declared:
                        heapq.heappop(self._heap)
                        quiet = False
                        if lease.closed:
                            self._closed = max(0, self._closed - 1)
                    elif lease.valid_until > when:  # confirmed since: watch the new deadline
                        heapq.heapreplace(self._heap, (lease.valid_until, next(self._seq), lease))
                    elif when <= now:
                        heapq.heappop(self._heap)
                        due.append(lease)
                    else:
                        break
                if due:
                    self._wake_at = -math.inf
                    return due
                if self._heap:
                    quiet = False
                    self._wake_at = self._heap[0][0]
                    self._cond.wait(min(self._wake_at - now, SLICE))
                elif not quiet:
                    # Just emptied: look again after a slice before sleeping for
                    # good. A loop of short locks, each released before this thread
                    # sees it, then wakes it once a slice, not once per lock.
                    quiet = True
                    self._wake_at = now + SLICE
                    self._cond.wait(SLICE)
                else:
                    self._wake_at = math.inf
                    self._cond.wait()

    def _run(self) -> None:
        try:
            self._watch_forever()
        finally:  # ended (it never should): the next lease starts another
            self._running = False

    def _watch_forever(self) -> None:
        mark_background()
        while True:
            for lease in self._next_due():
                # Reading ``lost`` declares it, by the rule every reader applies;
                # a lease confirmed meanwhile is watched again.
                try:
                    if not lease.lost and not lease.closed:
                        self.add(lease)
                except BaseException:  # the thread must go on watching the others
                    log(
                        logging.ERROR, "Declaring the loss of %r failed.", lease.key, exc_info=True
                    )


_watcher = DeadlineWatcher()
forks.on_fork(_watcher._after_fork)


def watcher() -> DeadlineWatcher:
    """The process's deadline watcher."""
    return _watcher
