"""Lock statements retried where retrying is safe: a busy database, a deadlock, a dead connection.

Every statement the database backend retries runs in autocommit, on the
caller's connection or on the side connection it gets inside a transaction
(see ``connections``): a statement that failed there was rolled back whole.
Each is bound to the caller's key and token (a sweep judges staleness again
by the server's clock), so sending it again decides afresh on the rows as
they are then, and changes nothing that the first attempt did.

**A busy SQLite.**
SQLite has one writer at a time. A statement that finds the file locked waits
for the connection's ``timeout`` (5 s unless ``OPTIONS`` say otherwise), then
fails with ``database is locked``; under a few busy writers on a loaded host
that happens although nothing is wrong. A busy failure is retried, for up
to :data:`BUSY_WAIT` in all, before the error is raised as the real error it
then is (never as "held"). Reads (``peek``, ``list``, and so a waiter's
looks at a held key) are retried the same way: a file busy with another
connection's write must not make ``wait=`` raise where a single attempt at
the same moment would not.

**A deadlock.** Two transactions that lock the same rows in different
orders deadlock, and the server cancels one statement: MySQL/MariaDB's
InnoDB with error 1213 (or 1205 when it gives up waiting for a row lock),
PostgreSQL with SQLSTATE ``40P01`` (or ``40001``, a serialization failure,
under ``REPEATABLE READ`` or ``SERIALIZABLE``). The lock's own statements
lock rows in key order, but the caller's transactions need not. A cancelled
statement is retried the same way, on the side connection too.

**A dead connection.** After a database restart or a killed backend, the
first statement on a thread's old connection fails. A release that fails so
would leave the lease to its ttl; it is sent once more on a new connection.

Inside the caller's own transaction (a Django ``TestCase``'s, or SQLite's
reads in one) nothing is retried: a failed statement there belongs to the
caller's transaction, which only the caller can retry.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from django.db import Error, OperationalError

from django_tasklock.backends.database.connections import (
    connection_for,
    joins_callers_transaction,
)

#: How long, in all, a lock statement keeps retrying a busy database.
BUSY_WAIT = 30.0
# SQLITE_BUSY and its extended codes (RECOVERY, SNAPSHOT, TIMEOUT); SQLITE_LOCKED and
# its SHAREDCACHE code: a table lock of a shared cache (``file:...?cache=shared``, what
# Django's test runner makes of ``:memory:``), "database table is locked". No busy
# handler waits for it, so only the retry does.
_BUSY_CODES = {5, 6, 261, 517, 773, 262}
# MySQL/MariaDB: ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT.
_MYSQL_BUSY_CODES = {1213, 1205}
# PostgreSQL: deadlock_detected, serialization_failure.
_PG_BUSY_STATES = {"40P01", "40001"}
_RETRYING_VENDORS = {"sqlite", "mysql", "postgresql"}

R = TypeVar("R")


class _HasAlias(Protocol):
    using: str


def is_busy(exc: BaseException, vendor: str) -> bool:
    cause = exc.__cause__
    if vendor == "mysql":
        args: tuple[object, ...] = getattr(cause, "args", ())
        return bool(args) and args[0] in _MYSQL_BUSY_CODES
    if vendor == "postgresql":
        sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        return sqlstate in _PG_BUSY_STATES
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None:
        return code in _BUSY_CODES
    text = str(exc)
    return (
        "database is locked" in text
        or "database table is locked" in text
        or "database schema is locked" in text
    )


def retry_when_busy(method: Callable[..., R]) -> Callable[..., R]:
    """Retry ``method`` while SQLite says the database is locked, or on a deadlock.

    Only where its statements run in autocommit (the side connection
    included), never in the caller's own transaction.
    """

    @functools.wraps(method)
    def wrapper(self: _HasAlias, *args: Any, **kwargs: Any) -> R:
        connection = connection_for(self.using)
        if connection.vendor not in _RETRYING_VENDORS or joins_callers_transaction(connection):
            return method(self, *args, **kwargs)
        deadline, pause = time.monotonic() + BUSY_WAIT, 0.002
        while True:
            try:
                return method(self, *args, **kwargs)
            except OperationalError as exc:
                if not is_busy(exc, connection.vendor) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 0.1)

    return wrapper


def retry_on_new_connection(method: Callable[..., R]) -> Callable[..., R]:
    """Send ``method``'s statement once more on a new connection if the old one was dead."""

    @functools.wraps(method)
    def wrapper(self: _HasAlias, *args: Any, **kwargs: Any) -> R:
        try:
            return method(self, *args, **kwargs)
        except Error:
            connection = connection_for(self.using)
            if connection.in_atomic_block or connection.connection is None:
                raise
            if connection.is_usable():
                raise  # the connection is fine: the error is real
            connection.close()
        return method(self, *args, **kwargs)

    return wrapper
