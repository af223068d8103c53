"""Whether a storage's clock stepped: its readings, against this process's clock.

A lease ends by the storage's clock (``expires_at`` on the database server,
a TTL in Redis), and its holder's local deadline is counted on this process's
:func:`~django_tasklock.leases.lease.clock` from when the last confirmation
was sent. Both run at the rate of real time, so the local deadline comes
first, unless the storage's clock *steps*: an NTP step, a virtual machine
resumed or moved. A step forward of ``s`` seconds ends every lease there
``s`` seconds sooner by real time, its ``max_lifetime`` cap too; a successor
may be granted a key whose holder still counts it live.

So the heartbeat reads the storage's clock (``BaseBackend.storage_time()``)
once per tick of each backend, before sending that tick's refreshes, and
:meth:`StorageClocks.look` compares two readings: between the two instants
the storage read its clock, at most ``answered - sent_before`` seconds passed
here. A storage clock that advanced more than that (beyond a tolerance) stepped
forward by at least the difference, and every lease of the process on that
storage is brought forward by it (``Lease.storage_stepped``): declared lost if
that puts it past its deadline, else refreshed in the same tick, which dates
it by the stepped clock. A step back only makes the storage keep leases longer
than their ttl (a dead holder's key frees later): it is logged, nothing else.

What this cannot see: a step between a tick and the next is noticed at the
next tick (at most ``refresh_interval`` later), as a force release is noticed
by the next refresh; meanwhile a successor may hold the key, and fencing
tokens protect the resource (see the protocol page of the docs).
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from typing import TYPE_CHECKING

from django_tasklock.leases.lease import clock
from django_tasklock.notifier import log

if TYPE_CHECKING:
    from django_tasklock.backends.base import BaseBackend

#: Seconds a storage clock may run ahead of this process's between two readings
#: without being taken for a step: the readings' rounding and the time a
#: statement takes between reading the clock and answering.
STEP_TOLERANCE = 0.25
#: And this share of the time between the readings: clocks that are slewed
#: (NTP slews at most 500 parts per million) run at slightly different rates.
RATE_TOLERANCE = 0.001


@dataclasses.dataclass(frozen=True)
class Reading:
    """One reading of a storage's clock, framed by this process's clock."""

    sent: float  #: :func:`clock` before asking
    answered: float  #: :func:`clock` once answered
    storage: float  #: the storage's clock, seconds since the epoch


class StorageClocks:
    """The last reading of each backend's clock, and what the next one says of it.

    Kept for as long as the backend lives (weakly: a backend dropped is
    forgotten), also while the heartbeat is idle: two readings an hour apart
    still tell a step, with a tolerance grown by :data:`RATE_TOLERANCE`.
    """

    def __init__(self) -> None:
        # None: the backend has no clock to read (or it could not be read yet).
        self._last: weakref.WeakKeyDictionary[BaseBackend, Reading | None] = (
            weakref.WeakKeyDictionary()
        )

    def known(self, backend: BaseBackend) -> bool:
        """Whether ``backend``'s clock was looked at (read, or found to be none)."""
        return backend in self._last

    def look(self, backend: BaseBackend) -> float:
        """Read ``backend``'s clock; the seconds it stepped forward since the last reading.

        The most the step can be, given when both readings were sent and
        answered. 0.0 when it did not step (within :data:`STEP_TOLERANCE` and
        :data:`RATE_TOLERANCE`), when there was no reading before, and when
        the backend has no clock to read or the read fails (the refreshes of
        the tick will say what is wrong).
        """
        sent = clock()
        try:
            storage = backend.storage_time()
        except Exception:
            log(logging.DEBUG, "Reading the lock storage's clock failed.", exc_info=True)
            self._last.setdefault(backend, None)
            return 0.0
        if storage is None:
            self._last[backend] = None
            return 0.0
        reading = Reading(sent, clock(), storage)
        last = self._last.get(backend)
        self._last[backend] = reading
        if last is None:
            return 0.0
        return _step(last, reading, type(backend).__name__)


def _step(before: Reading, after: Reading, name: str) -> float:
    """How far the storage's clock stepped forward between two readings (0.0: it did not)."""
    advanced = after.storage - before.storage
    most = after.answered - before.sent  # the longest that can have passed between them
    least = max(0.0, after.sent - before.answered)
    slack = STEP_TOLERANCE + RATE_TOLERANCE * most
    if advanced > most + slack:
        # At least ``advanced - most``; the leases are brought forward by the
        # most it can be, ``advanced - least``: early rather than late.
        step = advanced - least
        log(
            logging.WARNING,
            "The clock of the lock storage (%s) stepped forward by %.3f s to %.3f s: it "
            "advanced %.3f s while %.3f s to %.3f s passed here. Every lease of this "
            "process there ends that much sooner; their local deadlines are brought "
            "forward by %.3f s.",
            name,
            advanced - most,
            step,
            advanced,
            least,
            most,
            step,
        )
        return step
    if advanced < least - slack:
        log(
            logging.WARNING,
            "The clock of the lock storage (%s) stepped back by at least %.3f s: it advanced "
            "%.3f s while at least %.3f s passed here. Its leases end that much later than "
            "their ttl says (a crashed holder's key is freed later); nothing is lost.",
            name,
            least - advanced,
            advanced,
            least,
        )
    return 0.0
