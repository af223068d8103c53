"""SQL that differs between databases, where Django's portable expression is wrong for a lock.

* The time: Django's ``Now()`` is ``CURRENT_TIMESTAMP(6)`` on MySQL/MariaDB,
  the *session's* local time, so two sessions with different ``time_zone``
  settings (or one on each side of a DST change) would disagree about whether
  a lease is live. ``UtcNow`` is the server's clock in UTC on every database.
* Reading times back: Django reads them in the connection's zone (and naive
  with ``USE_TZ = False``). ``AsUtc`` and ``aware_utc`` give aware UTC instead,
  whatever ``USE_TZ`` and the session's zone are.
* The key prefix: SQLite's ``LIKE`` (``key__startswith``) ignores ASCII case;
  ``in_namespace`` matches ``task-lock:`` byte for byte.

``Compiled`` is not about correctness but cost: an INSERT's values resolved
and compiled once per database, not at every ``create()``.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from django.db.models import DateTimeField, Expression, Func, Q, Value
from django.db.models.functions import Left, Now
from django.db.models.lookups import Exact

from django_tasklock.backends.base import KEY_PREFIX


class UtcNow(Now):
    """The database server's current time in UTC, whatever the session's time zone.

    PostgreSQL's ``STATEMENT_TIMESTAMP()`` is an instant (``timestamptz``) and
    SQLite's clock is UTC already: only MySQL/MariaDB need another function.
    Every time the lock stores or compares is taken from it, so the stored
    columns hold UTC on MySQL/MariaDB and SQLite.
    """

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)


class AsUtc(Func):
    """A stored time as UTC wall-clock time, which ``aware_utc`` turns into an aware datetime.

    On PostgreSQL, ``timestamptz AT TIME ZONE 'UTC'``: otherwise the value
    would arrive in the session's zone, or naive in ``TIME_ZONE`` with
    ``USE_TZ = False``. Elsewhere the column already holds UTC (``UtcNow``
    wrote it) and is read as it is.
    """

    arity = 1
    template = "%(expressions)s"
    output_field = DateTimeField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="(%(expressions)s AT TIME ZONE 'UTC')", **extra_context
        )


# The server's clock as seconds (PostgreSQL) or microseconds (MySQL/MariaDB) since
# the epoch, whatever the session's time zone.
_SERVER_TIME = {
    "postgresql": ("SELECT EXTRACT(EPOCH FROM STATEMENT_TIMESTAMP())", 1.0),
    "mysql": ("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))", 1e-6),
}


def server_time(connection: Any) -> float | None:
    """The clock that dates ``connection``'s rows, in seconds since the epoch.

    One query on PostgreSQL and MySQL/MariaDB; SQLite's clock is this host's
    (``time.time()``, no query); None for other databases.
    """
    if connection.vendor == "sqlite":
        return time.time()
    known = _SERVER_TIME.get(connection.vendor)
    if known is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(known[0])
        (value,) = cursor.fetchone()
    return float(value) * known[1]


def aware_utc(value: datetime) -> datetime:
    """An ``AsUtc`` value as aware UTC.

    The value is UTC wall-clock time; Django may have labelled it with the
    connection's zone (MySQL, SQLite with ``USE_TZ``) without converting it,
    so the label is replaced, not converted.
    """
    return value.replace(tzinfo=timezone.utc)


def in_namespace() -> Q:
    """Keys that start with ``task-lock:``, compared byte for byte."""
    return key_starts_with(KEY_PREFIX)


def key_starts_with(prefix: str) -> Q:
    """Keys that start with ``prefix``, compared byte for byte.

    ``startswith`` lets PostgreSQL and MySQL use the key's index; the exact
    comparison of the first characters rejects ``Task-Lock:…`` on SQLite,
    whose ``LIKE`` folds ASCII case.
    """
    return Q(key__startswith=prefix) & Q(Exact(Left("key", len(prefix)), Value(prefix)))


class Compiled(Expression):
    """An INSERT value (``UtcNow() + ttl``) resolved and compiled once per database.

    ``create()`` resolves every expression value (copying it) and compiles it
    again at each call, which costs more CPU than sending the INSERT.
    This one answers its SQL from a cache, per alias and engine, filled by
    the ORM's own compiler the first time: the statement sent is the very one
    the plain expression gives. For INSERT values only (no columns, no
    aggregates: the compiler checks that on the plain expression).
    """

    contains_aggregate = False
    contains_over_clause = False
    contains_column_references = False

    def __init__(self, expression: Any) -> None:
        super().__init__(output_field=DateTimeField())
        self.expression = expression
        self._sql: dict[tuple[str, str], tuple[str, tuple[Any, ...]]] = {}

    def resolve_expression(self, *args: Any, **kwargs: Any) -> Compiled:
        return self  # nothing to resolve: as_sql compiles the plain expression once

    def as_sql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        where = (connection.alias, connection.settings_dict["ENGINE"])
        known = self._sql.get(where)
        if known is None:
            plain = self.expression.resolve_expression(
                compiler.query, allow_joins=False, for_save=True
            )
            sql, params = compiler.compile(plain)
            known = self._sql[where] = (sql, tuple(params))
        return known[0], list(known[1])
