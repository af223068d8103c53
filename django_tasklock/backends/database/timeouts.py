"""The refresh's statement timeout, scoped to the one statement it bounds.

The heartbeat refreshes every lease of the process, one call at a time: a
refresh statement stuck on a row lock would hold up all the others. So the
server cancels a refresh that runs longer than :data:`REFRESH_TIMEOUT`.

That timeout must end with its statement. The connection it runs on may be
the caller's own, a side connection borrowed from Django's pool and handed
back, or a server connection that PgBouncer gives another client next: a
session setting left there would cancel someone else's long query. So the
lock never changes a session setting:

* PostgreSQL: ``SET LOCAL statement_timeout = …; UPDATE …`` is sent as one
  simple query, which the server runs as one implicit transaction that the
  ``SET LOCAL`` ends with (behind PgBouncer in transaction pooling too). The
  values are inlined by psycopg's client-side cursor even when the connection
  uses ``server_side_binding``, whose extended protocol takes one statement a
  query. Inside a transaction (a Django ``TestCase``'s) a ``SET LOCAL`` would
  last until that transaction ends: there the refresh has no timeout.
* MariaDB: ``SET STATEMENT max_statement_time = … FOR UPDATE …``, a setting of
  that statement alone.
* MySQL: none (its ``MAX_EXECUTION_TIME`` hint bounds only SELECTs). SQLite
  waits for its lock at most its ``timeout`` option (5 s by default).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from importlib import import_module
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

#: A refresh statement running longer than this is cancelled by the server, so
#: that one stalled statement cannot hold up the other leases' refreshes.
REFRESH_TIMEOUT = timedelta(seconds=5)

_TIMEOUT_MS = int(REFRESH_TIMEOUT.total_seconds() * 1000)


def postgres_prefix(connection: BaseDatabaseWrapper) -> str:
    """``SET LOCAL statement_timeout = …;`` to send before a statement, or "" inside a transaction.

    The statement must then go through :func:`client_side_cursor`, in the same query.
    """
    if connection.in_atomic_block or not connection.get_autocommit():
        return ""
    return f"SET LOCAL statement_timeout = {_TIMEOUT_MS}; "


def mariadb_prefix(connection: BaseDatabaseWrapper) -> str:
    """``SET STATEMENT max_statement_time = … FOR`` on MariaDB, else ""."""
    if connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
        return f"SET STATEMENT max_statement_time = {REFRESH_TIMEOUT.total_seconds()} FOR "
    return ""


@contextmanager
def client_side_cursor(connection: BaseDatabaseWrapper) -> Iterator[Any]:
    """A PostgreSQL cursor that inlines the values, so one query may hold several statements.

    Django's own cursor (execute wrappers, query logging, error translation),
    made from psycopg's ``ClientCursor`` when the connection would otherwise
    bind on the server.
    """
    # Django's ClientCursor flavour: psycopg 3 only, as is server_side_binding.
    client_cursor = getattr(import_module("django.db.backends.postgresql.base"), "Cursor", None)
    if client_cursor is None or not connection.settings_dict["OPTIONS"].get("server_side_binding"):
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.ensure_connection()
    raw = connection.connection
    server_binding = raw.cursor_factory
    raw.cursor_factory = client_cursor
    try:
        cursor = connection.cursor()
    finally:
        raw.cursor_factory = server_binding
    with cursor:
        yield cursor
