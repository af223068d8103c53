"""Reaping: the heartbeat frees the keys of this machine's dead holders.

A process that finds a key held by a provably dead holder of its own
machine takes it over at once (the backends' ``acquire``). A taker on
another machine cannot prove that death: for it, the heartbeat of every
process of the holder's machine that holds at least one lease asks each
backend it holds leases on to end the leases of this machine whose holders
are gone (:meth:`~django_tasklock.backends.base.BaseBackend.reap_dead_holders`),
every :data:`REAP_INTERVAL` seconds, on the heartbeat's thread, between its
ticks. A process that holds no lease reaps nothing: it has no heartbeat
running.

The cost, per process holding a lease and per backend: one database SELECT
of this machine's live rows; on Redis, one ``SCAN`` of the database and a
script per 500 lock keys found (per slot and 500 on a cluster), the keys of
the process's own leases left out. A reap that takes
long spaces the next out: never more than one part in :data:`_DUTY` of the
thread's time.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING

from django_tasklock.backends.base import limited_key
from django_tasklock.leases.lease import clock
from django_tasklock.notifier import log
from django_tasklock.processes import this_machine

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from django_tasklock.backends.base import BaseBackend

#: Seconds between two reaps of a process's backends, at least.
REAP_INTERVAL = 5.0
# A reap that took t seconds is followed by the next no sooner than _DUTY * t later.
_DUTY = 20.0


class Reaper:
    """When the heartbeat next reaps, and the reaping itself."""

    def __init__(self) -> None:
        #: :func:`clock` time of the next reap (inf once nothing can be proven here).
        self.due_at = clock() + REAP_INTERVAL
        self._failing: set[int] = set()  # backends whose last reap failed

    def reap(self, ours: Mapping[BaseBackend, Collection[str]]) -> None:
        """End the dead holders' leases on the backends the process holds leases on, each
        given with the names of those leases (passed on as ``alive``: their holder is us)."""
        if this_machine() is None:  # no /proc: no death is ever proven here
            self.due_at = math.inf
            return
        started = clock()
        for backend, names in ours.items():
            if not backend.capabilities.dead_holders:
                continue
            try:
                ended = backend.reap_dead_holders(names)
            except Exception:
                # Best effort: unreaped, a dead holder's lease still ends by its ttl,
                # and a storage that is down is reported by the refreshes. Said once
                # until a reap there works again.
                level = logging.DEBUG if id(backend) in self._failing else logging.INFO
                self._failing.add(id(backend))
                log(level, "Reaping dead holders' task locks failed.", exc_info=True)
                # A connection the failure left broken: the next refresh opens a new one.
                with contextlib.suppress(Exception):
                    backend.close()
                continue
            self._failing.discard(id(backend))
            for held in ended:
                key, permit = limited_key(held.key)
                log(
                    logging.INFO,
                    "Freed task lock %s: its holder, host %s, pid %s, is gone.",
                    repr(key) if permit is None else f"{key!r} (permit {permit})",
                    held.holder.host,
                    held.holder.pid,
                )
        took = clock() - started
        self.due_at = clock() + max(REAP_INTERVAL, _DUTY * took)
