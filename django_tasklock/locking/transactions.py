"""Holding a lease until the caller's transaction ends.

Work done inside ``transaction.atomic()`` is invisible to other workers until
that transaction commits. Releasing the lease when the work returns would let
the next holder start before it can see what the previous one did: the lock
would exclude the code but not its effects. So the release waits:

* **Which transactions.** Every connection the calling thread has touched
  (``connections.all(initialized_only=True)``) that is inside an atomic block
  counts, whatever its database: the work's effects may go anywhere, and the
  lease may live elsewhere (Redis, memory).
* **Commit.** An ``on_commit`` callback on each of those connections releases
  the lease, in the calling thread, as soon as the last of them has committed.
* **Rollback.** Django announces none, but it drops the callbacks of a
  rolled-back transaction (or savepoint) from the connection's
  ``run_on_commit``. The heartbeat, which keeps the lease alive meanwhile,
  looks every ``WATCH_INTERVAL`` seconds and releases once none of our
  callbacks is waiting any more.
* **A Django ``TestCase`` transaction** never commits: it does not count, and
  the lease is released at once, as outside a transaction.
* **Manual transaction management** (autocommit off outside ``atomic()``)
  offers no ``on_commit``, and nothing tells when the caller commits. When the
  work ends with the caller's transaction committed (the driver says none is
  open: sqlite3, psycopg 3, psycopg2), the lease is released at once. When one
  is still open, or the driver cannot tell (mysqlclient, so MySQL and
  MariaDB), the lease is no longer refreshed and left to expire ``ttl`` after
  its last refresh: commit within ``ttl`` of the work's end.

Whether the lease was lost can only be known once it is released: a loss
found then is still logged and signalled (``lock_lost``), but the caller's
``LockResult.lost`` was computed earlier.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_tasklock.backends.database.connections import in_test_transaction
from django_tasklock.leases.heartbeat import heartbeat
from django_tasklock.leases.lease import Lease

logger = logging.getLogger("django_tasklock")


def release_after_transactions(lease: Lease, release: Callable[[Lease], None]) -> bool:
    """Arrange for ``release(lease)`` once the calling thread's transactions end.

    Returns False when the caller is in no transaction that counts: then
    release now. True when the release was taken care of.
    """
    touched = connections.all(initialized_only=True)
    if any(_manual_transaction(connection) for connection in touched):
        heartbeat().remove(lease)
        logger.info(
            "Task lock %r is left to expire within its ttl: its work ran with autocommit off, "
            "so its release cannot wait for the commit.",
            lease.key,
        )
        return True
    counted = [
        connection
        for connection in touched
        if connection.in_atomic_block and not in_test_transaction(connection)
    ]
    if not counted:
        return False
    _PendingRelease(lease, release, counted)
    return True


def _manual_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Autocommit turned off outside ``atomic()``, a transaction open: nobody can wait for it."""
    return (
        connection.connection is not None
        and not connection.in_atomic_block
        and not connection.autocommit
        and _transaction_open(connection.connection)
    )


def _transaction_open(raw: Any) -> bool:
    """Whether the driver's connection is inside a transaction; True where it cannot tell.

    sqlite3 says so (``in_transaction``), psycopg 3 and psycopg2 give the
    server's transaction status; mysqlclient tells nothing.
    """
    in_transaction = getattr(raw, "in_transaction", None)  # sqlite3
    if isinstance(in_transaction, bool):
        return in_transaction
    status = getattr(getattr(raw, "info", None), "transaction_status", None)  # psycopg 3
    if status is None and callable(getattr(raw, "get_transaction_status", None)):
        status = raw.get_transaction_status()  # psycopg2
    if status is None:
        return True
    return int(status) != 0  # both drivers' IDLE; a broken connection's UNKNOWN counts as open


class _PendingRelease:
    """One lease's release, waiting for the commit or rollback of some connections."""

    def __init__(
        self,
        lease: Lease,
        release: Callable[[Lease], None],
        waiting_on: list[BaseDatabaseWrapper],
    ) -> None:
        self._lease = lease
        self._release = release
        self._waiting_on = waiting_on
        self._settled = False
        self._settled_lock = threading.Lock()
        # The callbacks first: the heartbeat, once watching, takes a missing
        # callback for a rollback.
        for connection in waiting_on:
            connection.on_commit(self._committed, robust=True)
        heartbeat().watch(lease, self)

    def _committed(self) -> None:
        self.settle()

    def settle(self) -> bool:
        """Release if no connection still holds our callback (each committed or rolled back)."""
        if any(self._waiting(connection) for connection in self._waiting_on):
            return False
        with self._settled_lock:
            if self._settled:
                return True
            self._settled = True
        self._release(self._lease)
        return True

    def _waiting(self, connection: BaseDatabaseWrapper) -> bool:
        # A copy: the list may be replaced or popped by its own thread meanwhile.
        # Django pops a callback just before calling it, after the commit.
        return any(entry[1] == self._committed for entry in list(connection.run_on_commit))
