"""Which connection the database backend writes through, and how to read its errors.

A lease must be committed the moment it is taken: another worker has to see it
at once, and the caller's transaction must not be able to roll it back. So
when the calling thread is inside a transaction on the lock's database
(``atomic()``, or autocommit off, ``AUTOCOMMIT: False`` included), the
statements go through a second connection to the same database (the "side"
connection), always in autocommit, opened for those statements only and
closed (or handed back to Django's pool) right after: no connection of the
lock outlives the statement it was opened for, whatever ``CONN_MAX_AGE``
says, so nothing is left for ``close_old_connections()`` to miss. Two cases
differ:

* a Django ``TestCase`` transaction: the test's own connection is used, so
  that tests stay isolated and everything is rolled back;
* SQLite: one writer per database file, so a second connection would wait for
  the caller's transaction once it has begun; a clear error then says what to
  do instead.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, Error, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend
from django.utils.connection import ConnectionDoesNotExist

from django_tasklock import notifier
from django_tasklock.exceptions import TaskLockError

SIDE_SUFFIX = "__tasklock"

# Error codes of a duplicate primary key: PostgreSQL's SQLSTATE, SQLite's
# extended result codes (PRIMARYKEY, UNIQUE), MySQL's ER_DUP_ENTRY.
_PG_UNIQUE_VIOLATION = "23505"
_SQLITE_CONSTRAINT_KEY = {1555, 2067}
_MYSQL_DUP_ENTRY = 1062


def connection_for(using: str) -> BaseDatabaseWrapper:
    try:
        return connections[using]
    except ConnectionDoesNotExist as exc:
        raise ImproperlyConfigured(
            f"TASKLOCK_DATABASE = {using!r} is not a database alias; use one of: "
            f"{', '.join(settings.DATABASES)}."
        ) from exc


def in_test_transaction(connection: BaseDatabaseWrapper) -> bool:
    """True inside the transaction a Django ``TestCase`` wraps each test in."""
    return bool(connection.atomic_blocks) and getattr(
        connection.atomic_blocks[0], "_from_testcase", False
    )


def in_callers_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether a statement sent through ``connection`` would join a transaction of the caller's.

    Inside ``atomic()``, and whenever autocommit is off: turned off by
    ``transaction.set_autocommit(False)``, or by ``AUTOCOMMIT: False`` in the
    settings, which also holds for a connection not opened yet (Django opens
    it with autocommit off, and the first statement begins a transaction).
    """
    if connection.in_atomic_block:
        return True
    if connection.connection is None:
        return not connection.settings_dict.get("AUTOCOMMIT", True)
    # get_autocommit() without its ensure_connection(): the connection is open (this
    # runs several times per lock cycle).
    return not connection.autocommit


def joins_callers_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether the lock's statements for this alias would run in the caller's transaction.

    Only under a Django ``TestCase``, and on SQLite once a transaction has
    begun (where writing raises ``TaskLockError`` and reading uses the
    caller's connection). Everywhere else they run in autocommit, on the
    caller's connection or on a side connection (see :func:`alias_for_writing`).
    """
    if not in_callers_transaction(connection):
        return False
    if in_test_transaction(connection):
        return True
    return connection.vendor == "sqlite" and _sqlite_transaction_begun(connection)


@contextmanager
def alias_for_writing(using: str) -> Iterator[str]:
    """``using``, or, when ``using`` is in a transaction, a side connection open for the block.

    The side connection is a wrapper of the same database under the same
    alias, registered for this thread as ``using + "__tasklock"``, always in
    autocommit (whatever ``AUTOCOMMIT`` says): with Django's connection pool
    (PostgreSQL ``OPTIONS["pool"]``) it borrows from ``using``'s pool rather
    than making a second one. Nested blocks of one thread share it; the
    outermost closes it.

    Raises ``TaskLockError`` on SQLite inside a (non-test) transaction. With
    autocommit off but no transaction begun yet on the connection, SQLite
    gets a side connection too: nothing of the caller's holds the file.
    """
    connection = connection_for(using)
    if not in_callers_transaction(connection) or in_test_transaction(connection):
        yield using
        return
    if connection.vendor == "sqlite" and _sqlite_transaction_begun(connection):
        raise TaskLockError(
            f"Cannot take a task lock inside a transaction on the SQLite database {using!r}: "
            "SQLite has one writer at a time, so the lock could be neither committed at once "
            "nor released before your transaction ends. Acquire it outside "
            "transaction.atomic(), or keep the locks elsewhere (TASKLOCK_DATABASE naming "
            "another database, or TASKLOCK_BACKEND = 'redis')."
            + (
                _ATOMIC_REQUESTS_ADVICE.format(using=using)
                if connection.settings_dict.get("ATOMIC_REQUESTS")
                else ""
            )
        )
    side = using + SIDE_SUFFIX
    if _thread_connection(side) is not None:
        yield side
        return
    add_thread_connection(side, {**connection.settings_dict, "AUTOCOMMIT": True}, alias=using)
    try:
        yield side
    finally:
        try:
            connections[side].close()
        except Error:
            # Already broken: dropping the wrapper drops the connection. The
            # statements' outcome, not the farewell, is what the caller needs.
            # On the heartbeat's thread with autocommit off: handled on the notifier.
            notifier.log(
                logging.DEBUG, "Closing the side connection to %r failed.", using, exc_info=True
            )
        finally:
            del connections[side]


def _sqlite_transaction_begun(connection: BaseDatabaseWrapper) -> bool:
    """Inside ``atomic()``, or autocommit off and a statement already began a transaction."""
    if connection.in_atomic_block:
        return True
    return connection.connection is not None and bool(connection.connection.in_transaction)


@contextmanager
def alias_for_reading(using: str) -> Iterator[str]:
    """Where to read: as :func:`alias_for_writing`, but on SQLite in the caller's transaction."""
    side = ExitStack()
    try:
        alias = side.enter_context(alias_for_writing(using))
    except TaskLockError:
        alias = using
    with side:
        yield alias


def savepoint_if_in_transaction(alias: str) -> AbstractContextManager[Any]:
    """A savepoint where an IntegrityError would otherwise break the open transaction."""
    if connections[alias].in_atomic_block:
        return transaction.atomic(using=alias)
    return nullcontext()


# Under ATOMIC_REQUESTS Django opens the transaction, not the caller's code.
_ATOMIC_REQUESTS_ADVICE = (
    " ATOMIC_REQUESTS is on for {using!r}, so Django runs every view inside such a "
    "transaction: mark the views that take a task lock (@exclusive) with "
    "@transaction.non_atomic_requests (for a class-based view, wrap its as_view())."
)


def add_thread_connection(
    name: str, settings_dict: dict[str, Any], *, alias: str | None = None
) -> BaseDatabaseWrapper:
    """A connection known as ``name`` to this thread only, made from ``settings_dict``.

    ``alias``, the wrapper's own idea of its name (``name`` by default),
    decides which of Django's connection pools it draws from.
    Deliberately not added to ``DATABASES``: Django's test runners then
    neither create, flush nor guard it ("dynamically created connections").
    """
    wrapper: BaseDatabaseWrapper = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(
        settings_dict, alias or name
    )
    connections[name] = wrapper
    return wrapper


def close_connections(using: str) -> None:
    """Close this thread's connection to ``using``, if it has one."""
    connection = _thread_connection(using)
    if connection is not None:
        connection.close()


def _thread_connection(alias: str) -> BaseDatabaseWrapper | None:
    """This thread's connection object for ``alias``; None for a side alias not yet made here."""
    try:
        return connections[alias]
    except ConnectionDoesNotExist:
        return None


def is_key_conflict(exc: Exception) -> bool:
    """Whether an ``IntegrityError`` is a duplicate primary key (not, say, NOT NULL)."""
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if sqlstate is not None:
        return bool(sqlstate == _PG_UNIQUE_VIOLATION)
    sqlite_code = getattr(cause, "sqlite_errorcode", None)
    if sqlite_code is not None:
        return sqlite_code in _SQLITE_CONSTRAINT_KEY
    args = getattr(cause, "args", ())
    if args and args[0] == _MYSQL_DUP_ENTRY:
        return True
    text = str(exc).lower()
    return "unique" in text or "duplicate" in text


_P = ParamSpec("_P")
_R = TypeVar("_R")
# How each database says a table does not exist (SQLite, PostgreSQL, MySQL/MariaDB).
_NO_TABLE = ("no such table", "does not exist", "doesn't exist")


def names_missing_table(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Turn "no such table: cache_entries" into an error that says to migrate.

    Only the error path looks at the exception: the statements that succeed
    cost nothing more.
    """

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except DatabaseError as exc:
            using = args[0].using  # type: ignore[attr-defined]  # the backend
            text = str(exc).lower()
            # CacheEntry's, FenceCounter's (since migration 0003) and ForcedRelease's
            # (since 0005) tables.
            for table in ("cache_entries", "tasklock_fences", "tasklock_forced_releases"):
                if table in text and any(words in text for words in _NO_TABLE):
                    option = "" if using == "default" else f" --database {using}"
                    raise ImproperlyConfigured(
                        f"The {table} table of django-tasklock is missing from the database "
                        f"{using!r}: run `python manage.py migrate django_tasklock{option}`."
                    ) from exc
            raise

    return wrapper
