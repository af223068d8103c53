"""One tick of the heartbeat for one backend: send the refreshes due, read the answers.

Split from ``heartbeat`` (which schedules the leases) for size; the
:class:`~django_tasklock.leases.heartbeat.Heartbeat` is the only subclass.
"""

from __future__ import annotations

import heapq
import logging
import threading
from typing import TYPE_CHECKING

from django_tasklock.backends.base import PartlyRefreshed, Refresh
from django_tasklock.leases import ticks
from django_tasklock.leases.lease import clock
from django_tasklock.leases.storage_clock import StorageClocks
from django_tasklock.leases.watchdog import watcher
from django_tasklock.notifier import log
from django_tasklock.reasons import TAKEN

if TYPE_CHECKING:
    from django_tasklock.backends.base import BaseBackend
    from django_tasklock.leases.lease import Lease

# Leases found not ours in one answer that get a look to tell "taken" from
# "released_by_operator" (one peek each, on this thread); the rest are "taken".
_LOOKS_PER_TICK = 8


class BatchRefresher:
    """The heartbeat's refreshing of one batch, on its thread, under its condition."""

    _cond: threading.Condition
    _heap: list[tuple[float, int, list[Lease]]]  # (when, seq, the leases due then)
    _size: int  # leases in the heap's entries
    _closed: int  # closed leases still in the heap
    _taken: list[Lease]  # due leases taken off the heap
    _clocks: StorageClocks
    _touched: dict[int, BaseBackend]
    _waiting: int  # releases waiting for a refresh under way
    #: The leases of the refresh under way (under the condition): one list, not a
    #: flag set and cleared on each lease.
    _in_flight: list[Lease]
    #: Per backend, the leases last sent and the tuple of refreshes made of them.
    _batches: dict[int, tuple[list[Lease], tuple[Refresh, ...]]]

    def _beat(self, leases: list[Lease]) -> list[Lease]:
        """Refresh ``leases`` (all of one backend) in one call; return those to refresh again.

        First the storage's clock is read: if it stepped forward, every lease
        of the process there is brought forward and refreshed in this call
        (see ``storage_clock``). Meanwhile the deadline watcher judges every
        lease by its ``valid_until``. The leases being refreshed are
        ``_in_flight`` until the answer, so that a release can wait for it
        (see ``Heartbeat.remove``).
        """
        step = self._clocks.look(leases[0].backend)
        if step:
            leases = self._stepped(leases, step)
        live, looked, answers = self._send(leases)
        if isinstance(answers, PartlyRefreshed):
            # A part of the storage failed: its leases as if the whole call had.
            pairs = list(zip(live, answers.answers, strict=True))
            looked = looked + self._failed([x for x, ok in pairs if ok is None], answers)
            live = [x for x, ok in pairs if ok is not None]
            answers = [bool(ok) for _, ok in pairs if ok is not None]
        elif isinstance(answers, Exception):
            return looked + self._failed(live, answers)
        elif live:
            ticks.refresh_answered(live[0].backend)
        again: list[Lease] = looked
        looks = _LOOKS_PER_TICK
        answered_at = clock()
        if len(answers) == len(live) and all(answers):
            # Every one still ours (the usual answer): no loss to look into.
            for lease in live:
                if not lease.closed:
                    # Kept even if declared lost by its deadline meanwhile (below).
                    lease.valid_until = lease.confirmed_until
                    lease.answered_at = answered_at
                    again.append(lease)
            return again
        for lease, still_ours in zip(live, answers, strict=True):
            if lease.closed:
                continue
            if not still_ours:
                if lease.declared:
                    continue
                if clock() >= lease.valid_until:
                    # Past its deadline (a suspend during the call): it may simply
                    # have run out, so no look can tell "taken" or "released".
                    lease.expire()
                    continue
                looks -= 1
                lease.declare(lease.found_not_ours() if looks >= 0 else TAKEN)
                continue
            # Still ours, even if declared lost by its deadline while the call
            # was under way: nobody held the key meanwhile, so keep it.
            lease.valid_until = lease.confirmed_until
            lease.answered_at = answered_at
            again.append(lease)
        return again

    def _stepped(self, leases: list[Lease], step: float) -> list[Lease]:
        """Bring every lease of ``leases``' backend forward by ``step``; return them all.

        Those not due now are taken off the heap into this tick: refreshed now,
        by the stepped clock, they get their full ttl back, as the storage sees it.
        """
        backend = leases[0].backend
        with self._cond:
            others = [x for _, _, group in self._heap for x in group if x.backend is backend]
            if others:
                kept = []
                for when, seq, group in self._heap:
                    rest = [x for x in group if x.backend is not backend]
                    if rest:
                        kept.append((when, seq, rest))
                self._heap = kept
                heapq.heapify(self._heap)
                self._size -= len(others)
                dropped_closed = sum(x.closed for x in others)
                self._closed = max(0, self._closed - dropped_closed)
                others = [x for x in others if not x.closed]
                self._taken = [*self._taken, *others]
        everyone = [*leases, *others]
        for lease in everyone:
            lease.storage_stepped(step)
            if not lease.lost:  # else declared now, as by its deadline
                watcher().add(lease)  # its deadline came earlier
        return everyone

    def _send(
        self, leases: list[Lease]
    ) -> tuple[list[Lease], list[Lease], list[bool] | Exception]:
        """Settle pending releases and send the refreshes due.

        Returns the leases refreshed, those only looked at, and the answers
        (or the error the call failed with).
        """
        now = clock()
        backend = leases[0].backend
        with self._cond:
            self._touched[id(backend)] = backend  # the thread may open connections now
        live: list[Lease] = []
        looked: list[Lease] = []  # waiting for their caller's transaction, not due yet
        # Per options object (most leases share one): when a lease refreshed now is
        # due next, and what the refresh confirms, before its max_lifetime cap.
        terms: dict[int, tuple[float, float]] = {}
        last_options: object = None
        due = until = now
        for lease in leases:
            if lease.pending is not None:
                try:
                    if lease.pending.settle():
                        continue  # the caller's transaction ended: released
                except BaseException:  # the thread must go on, and so must the others
                    log(
                        logging.ERROR,
                        "The django-tasklock heartbeat failed on %r.",
                        lease.key,
                        exc_info=True,
                    )
                    looked.append(lease)
                    continue
                if now < lease.next_due:
                    looked.append(lease)  # only a look: no refresh due yet
                    continue
            options = lease.options
            if options is not last_options:
                known = terms.get(id(options))
                if known is None:
                    known = terms[id(options)] = (
                        now + options.refresh_interval.total_seconds(),
                        now + options.ttl.total_seconds(),
                    )
                due, until = known
                last_options = options
            deadline = lease.deadline
            if now >= deadline:
                lease.lost  # noqa: B018 - declared by its deadline, if not yet
                continue  # the storage would not extend it any more
            valid_until = lease.valid_until
            if valid_until <= now and lease.answered_at < valid_until:
                # Past its deadline with no answer since: not refreshed on
                # purpose (a progress_timeout stall, below) or this thread slept
                # through it (a suspend, which the clock counts and the sleep
                # does not); the storage has most likely let it go. Declared
                # "expired", not refreshed: a refresh would only find it gone.
                # (One answered after its deadline, still ours, is kept.)
                lease.lost  # noqa: B018 - declared by its deadline, if not yet
                continue
            if (
                lease.progress_timeout is not None  # else never stalled: no call
                and lease.pending is None
                and lease.stalled(now)  # progress_timeout passed
            ):
                if now < valid_until:
                    lease.next_due = valid_until  # not refreshed: looked at as it runs out
                    looked.append(lease)
                else:
                    lease.lost  # noqa: B018 - declared by its deadline, if not yet
                continue
            lease.next_due = due if due < deadline else deadline
            # What this refresh confirms, if it does: the storage dates it after now.
            lease.confirmed_until = until if until < deadline else deadline
            live.append(lease)
        with self._cond:
            # Released meanwhile: not sent. The others are waited for by a
            # release that must not be overtaken (see remove()).
            live = [lease for lease in live if not lease.closed]
            self._in_flight = live
        if not live:
            return live, looked, []
        try:
            answers = backend.refresh_many(self._refreshes(backend, live))
        except Exception as error:
            return live, looked, error
        finally:
            with self._cond:
                self._in_flight = []
                if self._waiting:
                    self._cond.notify_all()
        return live, looked, answers

    def _refreshes(self, backend: BaseBackend, live: list[Lease]) -> tuple[Refresh, ...]:
        """What ``refresh_many`` gets for ``live``: the last tick's tuple if the leases are
        the same, so that the backend can reuse what it built from it (the database
        backend its rows and statements' payloads); else a new one."""
        last = self._batches.get(id(backend))
        if last is not None and last[0] == live:  # Lease compares by identity
            return last[1]
        items = tuple(
            Refresh(x.stored_as, x.token, x.options.ttl, x.options.max_lifetime) for x in live
        )
        self._batches[id(backend)] = (live, items)
        return items

    def _failed(self, leases: list[Lease], error: Exception) -> list[Lease]:
        """After a failed refresh: logged, and the leases not lost retried at their interval.

        Those past their deadline are lost (declared by the deadline watcher,
        or here) and no longer refreshed.
        """
        if leases:  # a storage the heartbeat cannot reach: a health finding
            cause = error.__cause__ if isinstance(error, PartlyRefreshed) else None
            ticks.refresh_failed(leases[0].backend, leases, cause or error)
        again = [lease for lease in leases if not (lease.closed or lease.lost)]
        if again:
            log(
                logging.WARNING,
                "Refreshing task lock %r%s failed; retrying in %.1f s.",
                again[0].key,
                f" and {len(again) - 1} more" if len(again) > 1 else "",
                again[0].options.refresh_interval.total_seconds(),
                exc_info=error,
            )
        return again
