"""Who holds a key: the holder a token names, and a live lease as seen from outside.

Plain records, passed from the backends (``peek``, ``list``) up to every
layer that shows or reports a holder: the lock (``lock.seen``), the skip
report, ``AlreadyEnqueued``, the admin page, ``manage.py tasklock list`` and
the health check. They sit below the backends so that the errors of
``exceptions`` can carry one too. ``django_tasklock.backends.base`` re-exports
them, as before.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime

# Longer than any pid an operating system gives (Linux: at most 2**22).
_PID_DIGITS = 10

#: The first character of a ``unique_on`` claim's secret: never one of the
#: URL-safe base64 alphabet that a lock's own secret is made of.
CLAIM_MARK = "."

#: Characters of a holder's machine in its token (96 bits of a digest, see
#: ``django_tasklock.processes``).
MACHINE_CHARS = 16
# What a token's secret ends with where its holder can be proven gone:
# ``/<machine>.<start time>`` (``django_tasklock.processes.mark``). Anything
# after it (a database row's ``~released``) and it is no proof.
_PROOF = re.compile(rf"/([A-Za-z0-9_-]{{{MACHINE_CHARS}}})\.([0-9]{{1,20}})\Z")


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease: the host and pid named in its token (never the secret).

    Two holders are equal when they name the same host and pid; ``machine``
    and ``started`` are what proves, on the holder's own machine, that its
    process is gone (``django_tasklock.processes.holder_gone``).
    """

    host: str
    pid: int | None
    #: The lease is a ``unique_on`` claim: taken at the enqueue, for a task that
    #: may still wait in the queue (its secret begins with :data:`CLAIM_MARK`).
    claim: bool = dataclasses.field(default=False, compare=False)
    #: The holder's boot and pid namespace, as a digest; None in a token without it.
    machine: str | None = dataclasses.field(default=None, compare=False)
    #: The holder process's start time (clock ticks since boot); None likewise.
    started: int | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def from_token(cls, token: str) -> Holder:
        """Parse ``host:pid:secret`` (the secret may end with ``/<machine>.<start>``);
        anything else is the unknown holder ``?:?``.

        A value the lock did not write (another tool's row, a damaged one)
        must never break a listing: the pid counts only as ASCII digits of a
        sane length (``str.isdigit()`` also accepts ``"²"``, which ``int()``
        rejects, and ``int()`` refuses thousands of digits). A token of an
        older version (no ``/<machine>.<start>``) has no ``machine``: nobody
        can prove its holder gone, and its lease ends by its ttl.
        """
        rest, _, secret = token.rpartition(":")
        host, _, pid = rest.rpartition(":")
        if not (host and secret and pid.isascii() and pid.isdigit() and len(pid) <= _PID_DIGITS):
            return UNKNOWN_HOLDER
        proof = _PROOF.search(secret)
        if proof is None:
            return cls(host=host, pid=int(pid), claim=secret.startswith(CLAIM_MARK))
        return cls(
            host=host,
            pid=int(pid),
            claim=secret.startswith(CLAIM_MARK),
            machine=proof.group(1),
            started=int(proof.group(2)),
        )

    def __str__(self) -> str:
        return f"{self.host}:{self.pid if self.pid is not None else '?'}"


#: Who holds a lease whose value the lock did not write.
UNKNOWN_HOLDER = Holder(host="?", pid=None)


@dataclasses.dataclass(frozen=True)
class HeldLock:
    """A live lease as seen by :meth:`BaseBackend.peek` and :meth:`BaseBackend.list`."""

    key: str  #: the caller's key, without the ``task-lock:`` prefix
    holder: Holder
    acquired_at: datetime  #: aware, UTC, by the storage's clock
    expires_at: datetime  #: aware, UTC, by the storage's clock
    seconds_left: float  #: by the storage's clock at the time of reading
    #: this lease's name (:func:`lease_id` of its token): another holder's lease
    #: of the same key has another
    lease: str = ""
    #: a permit's (``key`` names one, see ``permit_key``): the limit its key's
    #: permits were taken with; None for a mutex's lease
    limit: int | None = None
