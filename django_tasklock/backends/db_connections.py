"""Which connection the database backend writes through, and how to read its errors.

A lease must be committed the moment it is taken: another worker has to see it
at once, and the caller's transaction must not be able to roll it back. So
when the calling thread is inside a transaction on the lock's database, the
statements go through a second connection of that thread to the same
database (the "side" connection). Two cases differ:

* a Django ``TestCase`` transaction: the test's own connection is used, so
  that tests stay isolated and everything is rolled back;
* SQLite: one writer per database file, so a second connection would wait for
  the caller's transaction; a clear error says what to do instead.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import load_backend
from django.utils.connection import ConnectionDoesNotExist

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


def alias_for_writing(using: str) -> str:
    """``using``, or the alias of this thread's side connection when ``using`` is in a transaction.

    Raises ``TaskLockError`` on SQLite inside a (non-test) transaction.
    """
    connection = connection_for(using)
    if connection.in_atomic_block:
        if in_test_transaction(connection):
            return using
    elif connection.connection is None or connection.get_autocommit():
        return using
    if connection.vendor == "sqlite":
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
    side_connection = _thread_connection(side)
    if side_connection is None:
        side_connection = add_thread_connection(side, connection.settings_dict)
    # Honour CONN_MAX_AGE and drop a broken connection, as Django does per request.
    side_connection.close_if_unusable_or_obsolete()
    return side


# Under ATOMIC_REQUESTS Django opens the transaction, not the caller's code.
_ATOMIC_REQUESTS_ADVICE = (
    " ATOMIC_REQUESTS is on for {using!r}, so Django runs every view inside such a "
    "transaction: mark the views that take a task lock (@exclusive) with "
    "@transaction.non_atomic_requests (for a class-based view, wrap its as_view())."
)


def add_thread_connection(alias: str, settings_dict: dict[str, Any]) -> BaseDatabaseWrapper:
    """A connection known as ``alias`` to this thread only, made from ``settings_dict``.

    Deliberately not added to ``DATABASES``: Django's test runners then
    neither create, flush nor guard it ("dynamically created connections").
    """
    wrapper: BaseDatabaseWrapper = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(
        settings_dict, alias
    )
    connections[alias] = wrapper
    return wrapper


def close_connections(using: str) -> None:
    """Close this thread's connections to ``using`` made by the lock (and ``using``'s own)."""
    for alias in (using, using + SIDE_SUFFIX):
        connection = _thread_connection(alias)
        if connection is not None:
            connection.close()


def close_side_connections(**kwargs: Any) -> None:
    """``request_started``/``request_finished`` receiver: what Django does for its own."""
    for alias in list(settings.DATABASES):
        side = _thread_connection(alias + SIDE_SUFFIX)
        if side is not None:
            side.close_if_unusable_or_obsolete()


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
