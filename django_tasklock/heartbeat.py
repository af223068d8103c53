"""Keeping held leases alive: one daemon thread for the whole process.

Every lease the process holds is scheduled on one heap; the thread sleeps until
the earliest is due, refreshes it through its backend, and schedules it again
``refresh_interval`` later. The thread is a daemon (it never keeps the process
alive at exit), starts on the first lease, is recreated in a forked child, and
lets go of its connections whenever it has nothing to keep alive.

A lease stops being refreshed when it is released, found lost, or reaches
``max_lifetime`` (then a warning is logged and the lease allowed to expire; the
backend caps it on the storage side as well).

A lease whose release waits for the caller's transaction (see
``transactions``) stays here, still refreshed, and is looked at every
``lease.WATCH_INTERVAL`` seconds to notice a rollback, which nothing else announces.

Local deadlines are read off :func:`~django_tasklock.lease.clock`, which keeps counting while the
machine is suspended (``CLOCK_BOOTTIME`` on Linux): after a resume, a lease
whose ttl passed during the sleep is known to be lost, not "retried".
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
from typing import TYPE_CHECKING

from django_tasklock.lease import clock

if TYPE_CHECKING:
    from django_tasklock.backends.base import BaseBackend
    from django_tasklock.lease import Lease, PendingRelease

logger = logging.getLogger("django_tasklock")

# Closed leases tolerated in the heap before it is compacted.
_COMPACT_AFTER = 64


class Heartbeat:
    """The process's refresher of leases."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._start_empty()

    def _start_empty(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Lease]] = []
        self._thread: threading.Thread | None = None
        self._touched: dict[int, BaseBackend] = {}
        self._closed = 0  # closed leases still in the heap

    def add(self, lease: Lease) -> None:
        with self._cond:
            heapq.heappush(self._heap, (lease.next_due, next(self._seq), lease))
            self._touched[id(lease.backend)] = lease.backend
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="django-tasklock-heartbeat", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is lease:
                self._cond.notify()  # due before whatever the thread sleeps until

    def remove(self, lease: Lease) -> None:
        """Stop refreshing ``lease``; a refresh already under way is disregarded.

        The thread is woken only when nothing is left to keep alive. Closed
        leases are dropped when they come due, or all at once when they are
        half the heap (many short locks with a long ttl would otherwise pile
        up until their first refresh is due).
        """
        with self._cond:
            lease.closed = True
            self._closed += 1
            if self._closed >= len(self._heap) or (
                self._closed > _COMPACT_AFTER and 2 * self._closed > len(self._heap)
            ):
                self._heap = [entry for entry in self._heap if not entry[2].closed]
                heapq.heapify(self._heap)
                self._closed = 0
                if not self._heap:
                    self._cond.notify()  # going idle: let the thread close its connections

    def watch(self, lease: Lease, pending: PendingRelease) -> None:
        """Keep ``lease`` alive until ``pending`` settles it, looking at it often."""
        with self._cond:
            lease.pending = pending
            soon = lease.wake_at()
            for index, (when, seq, queued) in enumerate(self._heap):
                if queued is lease and when > soon:
                    self._heap[index] = (soon, seq, queued)
                    heapq.heapify(self._heap)
                    self._cond.notify()
                    break

    def _after_fork(self) -> None:
        # The child has no heartbeat thread, and the parent's leases are the
        # parent's to keep alive; the condition may have been held mid-fork.
        self._start_empty()

    def _next_due(self) -> Lease | list[BaseBackend]:
        """The next lease when it is due; or, on going idle, the backends to close."""
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].closed:
                    heapq.heappop(self._heap)
                    self._closed = max(0, self._closed - 1)
                if not self._heap:
                    if self._touched:
                        idle, self._touched = list(self._touched.values()), {}
                        return idle
                    self._cond.wait()
                    continue
                due = self._heap[0][0] - clock()
                if due <= 0:
                    return heapq.heappop(self._heap)[2]
                self._cond.wait(due)

    def _run(self) -> None:
        while True:
            due = self._next_due()
            if isinstance(due, list):
                # Nothing to keep alive: connections this thread opened would
                # only sit open (and keep test databases from being dropped).
                for backend in due:
                    try:
                        backend.close()
                    except Exception:  # pragma: no cover - closing is best effort
                        logger.debug("Closing idle connections failed.", exc_info=True)
                continue
            try:
                again = self._beat(due)
            except BaseException:  # even SystemExit from a receiver: the thread must go on
                logger.exception("The django-tasklock heartbeat failed on %r.", due.key)
                interval = due.options.refresh_interval.total_seconds()
                due.next_due = max(due.next_due, clock() + interval)
                again = True
            if again:
                with self._cond:
                    if not due.closed:
                        heapq.heappush(self._heap, (due.wake_at(), next(self._seq), due))

    def _beat(self, lease: Lease) -> bool:
        """Refresh ``lease`` once. True if it should be refreshed again."""
        now = clock()
        if lease.pending is not None:
            if lease.pending.settle():
                return False  # the caller's transaction ended: released
            if now < lease.next_due:
                return True  # only a look: no refresh due yet
        if now >= lease.deadline:
            logger.warning(
                "Task lock %r reached its max_lifetime of %s: no longer refreshed, the lease "
                "will expire while the work may still be running.",
                lease.key,
                lease.options.max_lifetime,
            )
            return False
        interval = lease.options.refresh_interval.total_seconds()
        lease.next_due = min(now + interval, lease.deadline)
        try:
            still_ours = lease.backend.refresh(
                lease.key,
                lease.token,
                ttl=lease.options.ttl,
                max_lifetime=lease.options.max_lifetime,
            )
        except Exception:
            if lease.closed:
                return False
            if clock() > lease.valid_until:
                logger.warning("Refreshing task lock %r failed.", lease.key, exc_info=True)
                lease.report_lost("no refresh succeeded before the lease ran out")
                return False
            logger.warning(
                "Refreshing task lock %r failed; retrying in %.1f s.",
                lease.key,
                interval,
                exc_info=True,
            )
            return True
        if lease.closed:
            return False
        if not still_ours:
            lease.report_lost("refresh")
            return False
        lease.valid_until = min(now + lease.options.ttl.total_seconds(), lease.deadline)
        return True


_heartbeat = Heartbeat()
os.register_at_fork(after_in_child=_heartbeat._after_fork)


def heartbeat() -> Heartbeat:
    """The process's heartbeat."""
    return _heartbeat
