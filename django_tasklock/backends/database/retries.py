"""Lock statements retried where retrying is safe: a busy database, a dead connection.

Every statement the database backend sends is one autocommit statement that
either ran whole or not at all, and is bound to the caller's key and token, so
sending it again changes nothing that the first attempt did not.

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

**A deadlock on MySQL/MariaDB.** InnoDB may pick one of two statements on
the same index range as a deadlock victim (error 1213) or give up waiting
for a row lock (1205); in autocommit that statement was rolled back whole,
and it is retried the same way.

**A dead connection.** After a database restart or a killed backend, the
first statement on a thread's old connection fails. A release that fails so
would leave the lease to its ttl; it is sent once more on a new connection.

Inside a transaction nothing is retried: a failed statement there belongs to
the caller's transaction, which only the caller can retry.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from django.db import Error, OperationalError

from django_tasklock.backends.database.connections import connection_for

#: How long, in all, a lock statement keeps retrying a busy database.
BUSY_WAIT = 30.0
# SQLITE_BUSY and its extended codes (RECOVERY, SNAPSHOT, TIMEOUT); SQLITE_LOCKED.
_BUSY_CODES = {5, 6, 261, 517, 773}
# MySQL/MariaDB: ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT.
_MYSQL_BUSY_CODES = {1213, 1205}

R = TypeVar("R")


class _HasAlias(Protocol):
    using: str


def is_busy(exc: BaseException, vendor: str) -> bool:
    cause = exc.__cause__
    if vendor == "mysql":
        args: tuple[object, ...] = getattr(cause, "args", ())
        return bool(args) and args[0] in _MYSQL_BUSY_CODES
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None:
        return code in _BUSY_CODES
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


def retry_when_busy(method: Callable[..., R]) -> Callable[..., R]:
    """Retry ``method`` while SQLite says the database is locked, or MySQL says deadlock.

    Only outside a transaction, where the failed statement was rolled back alone.
    """

    @functools.wraps(method)
    def wrapper(self: _HasAlias, *args: Any, **kwargs: Any) -> R:
        connection = connection_for(self.using)
        if connection.vendor not in {"sqlite", "mysql"} or connection.in_atomic_block:
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
