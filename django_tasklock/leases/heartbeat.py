"""Keeping held leases alive: one daemon thread for the whole process.

Every lease the process holds is scheduled on one heap, in groups: the leases
refreshed together, due again at one time, go back as one entry (a new lease
comes as an entry of its own). The thread sleeps until the earliest is due,
then refreshes every lease due by then (and those due within half their
interval) with one ``refresh_many`` call per backend (one
statement per 500 leases for the built-in backends), and schedules each again
``refresh_interval`` later. Each lost lease is still reported on its own.
Releasing never waits for a refresh under way, except with ``min_hold`` (see
:meth:`Heartbeat.remove`). The thread is a daemon, starts
on the first lease, is recreated in a forked child, and lets go of its
connections whenever it has nothing to keep alive.

A lease stops being refreshed when it is released, its lock object is
garbage-collected unreleased (``dropped``: it is then left to run out within its
``ttl``, with a warning naming the key and where it was acquired), found gone or someone
else's, reaches ``max_lifetime`` (the backend caps it on the storage side as
well), or, lost past its deadline, its refresh fails; given a
``progress_timeout``, also when its work stopped calling ``Lock.progress()``
(``lock_stalled``; it then runs out and is declared lost by its deadline).
Losses by the clock are the deadline watcher's to declare (see ``watchdog``),
whatever this thread is doing; this thread declares those its answers reveal,
and a lease it finds past its deadline before sending (after a suspend).
It never runs a receiver or a log handler: those run on the notifier thread
(see ``notifier``).

A lease whose release waits for the caller's transaction (see
``transactions``) stays here, still refreshed, and is looked at every
``lease.WATCH_INTERVAL`` seconds to notice a rollback, which nothing else announces.

Local deadlines are read off :func:`~django_tasklock.leases.lease.clock`, which keeps
counting while the machine is suspended (``CLOCK_BOOTTIME`` on Linux).

Between ticks, while it keeps at least one lease alive, the thread also
reaps: it frees the keys of this machine's dead holders (see ``reaping``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import operator
import threading
from typing import TYPE_CHECKING

from django_tasklock import forks
from django_tasklock.leases import observe
from django_tasklock.leases.lease import clock
from django_tasklock.leases.reaping import Reaper
from django_tasklock.leases.refreshing import BatchRefresher
from django_tasklock.leases.storage_clock import StorageClocks
from django_tasklock.leases.ticks import tick_ended, tick_started
from django_tasklock.leases.watchdog import watcher
from django_tasklock.notifier import log, mark_background

if TYPE_CHECKING:
    from django_tasklock.backends.base import BaseBackend
    from django_tasklock.leases.lease import Lease, PendingRelease

# Closed leases tolerated in the heap before it is compacted.
_COMPACT_AFTER = 64
# A lease due within this share of its refresh interval is refreshed with the
# ones due now (see Heartbeat._next_due).
_EARLY = 0.5
# Leases taken off or put on the heap at once from which one pass over the
# heap costs less than a pop or push each (see Heartbeat._take, _schedule).
_SPLIT_AT = 256
# Seconds an idle thread sleeps before looking at the heap again by itself: the
# shortest refresh interval seen, within these bounds.
_IDLE_WAKE = 30.0
_IDLE_WAKE_MIN = 1.0


class Heartbeat(BatchRefresher):
    """The process's refresher of leases."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._start_empty()

    def _start_empty(self) -> None:
        # The condition's lock, taken directly where nothing waits or is woken
        # (add, remove): a ``with`` on the condition adds a Python call each way.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        # (when, seq, leases): the leases due at ``when``, in the order scheduled.
        self._heap: list[tuple[float, int, list[Lease]]] = []
        self._size = 0  # leases in the heap's entries, closed ones included
        # No entry of the heap is due after this (see _take, _schedule).
        self._latest = -math.inf
        self._thread: threading.Thread | None = None
        self._running = False  # the thread's liveness, read per lease without is_alive()
        # Backends the thread refreshed through since it last went idle: only
        # those can have connections of the thread's to close.
        self._touched: dict[int, BaseBackend] = {}
        self._batches = {}  # see BatchRefresher._refreshes
        # The storages' clocks (see ``storage_clock``), and the backends whose clock
        # the thread is to read now, the first time one of their leases comes.
        self._clocks = StorageClocks()
        self._unread: dict[int, BaseBackend] = {}
        self._closed = 0  # closed leases still in the heap
        # When the thread next looks at the heap by itself (-inf: it is busy
        # and will look before sleeping): a new lease due later needs no wake-up.
        self._wake_at = math.inf
        self._idle_wake = _IDLE_WAKE
        self._taken: list[Lease] = []  # due leases the thread has taken off the heap
        self._waiting = 0  # releases waiting for a refresh under way (see remove)
        self._in_flight = []  # the leases of the refresh under way
        # This machine's dead holders, reaped between ticks (see ``reaping``).
        self._reaper = Reaper()
        self._reap_now = False

    def add(self, lease: Lease) -> None:
        interval = lease.options.refresh_interval.total_seconds()
        with self._mutex:
            heapq.heappush(self._heap, (lease.next_due, next(self._seq), [lease]))
            self._size += 1
            if lease.next_due > self._latest:
                self._latest = lease.next_due
            backend = lease.backend
            if id(backend) not in self._unread and not self._clocks.known(backend):
                # A first reading of its clock, at once: a step from now on is seen.
                self._unread[id(backend)] = backend
                self._wake_at = -math.inf
                self._cond.notify()
            if interval < self._idle_wake:
                self._idle_wake = max(_IDLE_WAKE_MIN, interval)
            if not self._running:
                self._thread = threading.Thread(
                    target=self._run, name="django-tasklock-heartbeat", daemon=True
                )
                self._running = True
                try:
                    self._thread.start()
                except BaseException:  # no thread (e.g. none can be started now)
                    self._running = False
                    raise
            elif lease.next_due < self._wake_at:
                self._wake_at = lease.next_due
                self._cond.notify()  # due before whatever the thread sleeps until
        watcher().add(lease)

    def remove(self, lease: Lease, *, wait: bool = False) -> None:
        """Stop refreshing ``lease``; from now on its ``lost`` is final.

        A lease past its local deadline is declared lost first. A refresh
        already under way is disregarded, and not waited for unless ``wait``:
        then this returns once that refresh has answered (or failed), or after
        the lease's ``ttl`` at most, so that a release sent next (``min_hold``:
        "end at acquisition + min_hold") reaches the storage after it and is
        not overtaken by it. Any refresh not yet sent is not sent.

        The thread is woken only when nothing is left to keep alive and it has
        connections to close. Closed leases are dropped when they come due, or
        all at once when they are half the heap (many short locks with a long
        ttl would otherwise pile up until their first refresh is due).
        """
        if not lease.closed and clock() >= lease.valid_until:
            lease.expire(inline=True)  # before lock_released, on the releasing thread
        with self._mutex:
            lease.closed = True
            if wait and lease in self._in_flight:  # by identity: Lease has no __eq__
                self._waiting += 1
                try:
                    self._cond.wait_for(
                        lambda: lease not in self._in_flight,
                        timeout=lease.options.ttl.total_seconds(),
                    )
                finally:
                    self._waiting -= 1
            self._closed += 1
            if self._closed >= self._size or (
                self._closed > _COMPACT_AFTER and 2 * self._closed > self._size
            ):
                self._compact()
                if not self._heap and self._touched:
                    self._cond.notify()  # going idle: let the thread close its connections
        watcher().removed()

    def _compact(self) -> None:
        """Drop the closed leases from the heap (under the lock)."""
        kept = []
        for when, seq, group in self._heap:
            live = [lease for lease in group if not lease.closed]
            if live:
                kept.append((when, seq, live))
        heapq.heapify(kept)
        self._heap = kept
        self._size = sum(len(group) for _, _, group in kept)
        self._closed = 0

    def watch(self, lease: Lease, pending: PendingRelease) -> None:
        """Keep ``lease`` alive until ``pending`` settles it, looking at it often."""
        with self._cond:
            lease.pending = pending
            soon = lease.wake_at()
            for index, (when, seq, group) in enumerate(self._heap):
                if when > soon and any(queued is lease for queued in group):
                    # Out of its group (by identity: Lease has no __eq__), on its own.
                    rest = [queued for queued in group if queued is not lease]
                    if rest:
                        self._heap[index] = (when, seq, rest)
                        self._heap.append((soon, next(self._seq), [lease]))
                    else:
                        self._heap[index] = (soon, seq, group)
                    heapq.heapify(self._heap)
                    self._cond.notify()
                    break

    def _after_fork(self) -> None:
        # The child has no heartbeat thread, and the parent's leases are the
        # parent's to keep alive; the condition may have been held mid-fork.
        self._start_empty()

    def _drop(self, dropped: list[Lease]) -> None:
        """Warn of the leases whose lock objects were collected unreleased (closed by
        :meth:`_next_due`, which took them off the heap unrefreshed)."""
        for lease in dropped:
            watcher().removed()
            log(
                logging.WARNING,
                "Task lock %r (acquired at %s:%s in %s) was garbage-collected without release(): "
                "its lease is no longer refreshed and runs out within its ttl (%s s). "
                "Release every lock you acquire: use `with lock(...)` or call release() "
                "in a finally block.",
                lease.key,
                *(lease.dropped or ("?", 0, "?")),
                lease.options.ttl.total_seconds(),
            )

    def _next_due(self) -> tuple[list[Lease], list[BaseBackend], list[Lease]]:
        """The leases due now (and those due soon); or, on going idle, the backends to close;
        and the due leases whose lock objects were collected unreleased (``dropped``).

        Leases due within half the first one's refresh interval join it:
        refreshing a little early costs nothing, and leases taken at different
        times then share one statement instead of one each.
        """
        with self._cond:
            while True:
                if self._unread:
                    return [], [], []  # the caller reads their clocks first
                while self._heap and all(lease.closed for lease in self._heap[0][2]):
                    _, _, group = heapq.heappop(self._heap)
                    self._size -= len(group)
                    self._closed = max(0, self._closed - len(group))
                if not self._heap:
                    if self._touched:
                        idle, self._touched = list(self._touched.values()), {}
                        self._batches.clear()  # let go of the leases last sent
                        return [], idle, []
                    # Idle, but looking again every shortest interval seen: a
                    # new lease is then due after that and needs no wake-up (a
                    # loop of short locks would otherwise wake the thread for each).
                    self._wake_at = clock() + self._idle_wake
                    self._cond.wait(self._idle_wake)
                    continue
                now = clock()
                if self._heap[0][0] > now:
                    if self._reaper.due_at <= now:
                        self._reap_now = True
                        return [], [], []  # the caller reaps first
                    self._wake_at = min(self._heap[0][0], self._reaper.due_at)
                    self._cond.wait(self._wake_at - now)
                    continue
                self._wake_at = -math.inf
                # Refreshing early is always safe; the first lease's interval
                # sets how early, for the price of one look per tick.
                first = self._heap[0][2][0].options.refresh_interval.total_seconds()
                horizon = now + _EARLY * first
                due: list[Lease] = []
                dropped: list[Lease] = []
                for lease in self._take(horizon):
                    if lease.closed:
                        self._closed = max(0, self._closed - 1)
                    elif lease.dropped is not None:
                        lease.closed = True  # off the heap already: not counted in _closed
                        dropped.append(lease)
                    else:
                        due.append(lease)
                self._taken = due
                return due, [], dropped

    def _take(self, horizon: float) -> list[Lease]:
        """Take the leases due by ``horizon`` off the heap, in the order they come due.

        Most often (leases refreshed together come due together) that is the
        whole heap, or most of it: then taken in one pass and sorted, rather
        than popped one by one.
        """
        heap = self._heap
        if self._latest <= horizon:  # every entry due
            self._heap = []
            self._latest = -math.inf
            heap.sort()  # by (when, seq): the order popping gives
        elif len(heap) < _SPLIT_AT or heap[-1][0] > horizon:  # a leaf not due: likely a few
            popped = []
            while heap and heap[0][0] <= horizon:
                popped.append(heapq.heappop(heap))
            heap = popped
        else:
            self._heap = [entry for entry in heap if entry[0] > horizon]
            heapq.heapify(self._heap)
            heap = sorted(entry for entry in heap if entry[0] <= horizon)
        taken = list(itertools.chain.from_iterable(map(_group_of, heap)))
        self._size -= len(taken)
        return taken

    def _schedule(self, leases: list[Lease]) -> None:
        """Put ``leases`` (not closed) back on the heap, at their ``wake_at`` (under the lock).

        Those due at one time go back as one entry (the usual: a tick's leases
        are all due one interval after it), so a tick allocates no entry per lease.
        """
        leases = [lease for lease in leases if not lease.closed]
        if not leases:
            return
        whens = [x.next_due if x.pending is None else x.wake_at() for x in leases]
        first, last = min(whens), max(whens)
        if first == last:
            entry = (first, next(self._seq), leases)
            if first >= self._latest:
                # After every entry, with the latest seq: appended, it is in
                # heap order already (at least its parent).
                self._heap.append(entry)
            else:
                heapq.heappush(self._heap, entry)
        else:
            groups: dict[float, list[Lease]] = {}
            for when, lease in zip(whens, leases, strict=True):
                group = groups.get(when)
                if group is None:
                    groups[when] = [lease]
                else:
                    group.append(lease)
            for when, group in groups.items():  # in the order of their first lease
                heapq.heappush(self._heap, (when, next(self._seq), group))
        self._size += len(leases)
        if last > self._latest:
            self._latest = last

    def _read_new_clocks(self) -> None:
        """The first reading of each new backend's clock (see ``storage_clock``)."""
        with self._cond:
            if not self._unread:
                return
            unread, self._unread = list(self._unread.values()), {}
            for backend in unread:
                self._touched[id(backend)] = backend  # the thread may open connections now
        for backend in unread:
            self._clocks.look(backend)

    def _reap(self) -> None:
        """End the leases of this machine's dead holders on the backends of our leases.

        Counted as a tick of all our leases: their refreshes wait for it, and a
        storage that keeps the reap waiting keeps the heartbeat behind (W012).
        """
        with self._cond:
            self._reap_now = False
            waiting = [x for _, _, group in self._heap for x in group if not x.closed]
            held: dict[BaseBackend, set[str]] = {}
            for lease in waiting:  # each backend, with the names of our leases there
                held.setdefault(lease.backend, set()).add(lease.stored_as)
            self._touched.update((id(backend), backend) for backend in held)  # may connect now
        tick = tick_started(waiting) if waiting else None
        try:
            self._reaper.reap(held)
        finally:
            if tick is not None:
                tick_ended(tick)

    def _run(self) -> None:
        try:
            self._beat_forever()
        finally:  # ended (it never should): the next lease starts another
            self._running = False

    def _beat_forever(self) -> None:
        mark_background()
        while True:
            due, idle, dropped = self._next_due()
            if dropped:
                self._drop(dropped)
            self._read_new_clocks()
            if self._reap_now:
                self._reap()
            # Nothing to keep alive: connections this thread opened would only
            # sit open (and keep test databases from being dropped).
            for backend in idle:
                try:
                    backend.close()
                except Exception:  # pragma: no cover - closing is best effort
                    log(logging.DEBUG, "Closing idle connections failed.", exc_info=True)
            by_backend: dict[int, list[Lease]] = {}
            backends = list(map(_backend_of, due))
            if due and all(map(operator.is_, backends, itertools.repeat(backends[0]))):
                by_backend[id(backends[0])] = due  # the usual: one backend, no grouping
            else:
                for lease, backend in zip(due, backends, strict=True):
                    by_backend.setdefault(id(backend), []).append(lease)
            for leases in by_backend.values():
                tick = tick_started(leases)
                try:
                    if observe.observer is None:
                        again = self._beat(leases)
                    else:
                        with observe.observer.heartbeat(leases):
                            again = self._beat(leases)
                except BaseException:  # the thread must go on
                    log(
                        logging.ERROR,
                        "The django-tasklock heartbeat failed on %r.",
                        [x.key for x in leases],
                        exc_info=True,
                    )
                    for lease in leases:
                        interval = lease.options.refresh_interval.total_seconds()
                        lease.next_due = max(lease.next_due, clock() + interval)
                    again = leases
                tick_ended(tick)
                with self._cond:
                    self._schedule(again)
            with self._cond:
                self._taken = []


_backend_of = operator.attrgetter("backend")
_group_of = operator.itemgetter(2)

_heartbeat = Heartbeat()
forks.on_fork(_heartbeat._after_fork)


def heartbeat() -> Heartbeat:
    """The process's heartbeat."""
    return _heartbeat
