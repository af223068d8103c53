"""Statements of the database backend that are built once, not per call.

The per-call cost of a lock is meant to be the storage's: building a queryset,
cloning it for each ``filter()`` and compiling it again for every release costs
more than the DELETE itself on a fast database. So the release's DELETE is
compiled here once per connection (by the ORM's own compiler: the very SQL
``QuerySet._raw_delete`` sends) and only its parameters change per call.

The heartbeat's batch refresh is one UPDATE per chunk of leases. PostgreSQL
gets ``UPDATE ... FROM json_array_elements(...) RETURNING``, which carries each lease's own
ttl and cap; other databases get one ORM UPDATE per chunk of leases that share
a ttl and a cap, then, only when fewer rows changed than were asked, one SELECT
to tell which are still ours.

Statements that write many rows lock them in primary-key order. Two such
statements sharing rows (``clear_stale`` and a heartbeat's refresh, say)
would otherwise lock them in different orders and deadlock: PostgreSQL meets
rows in the order of its plan (the list sent, the table's pages), so its
refresh and its sweep lock their rows first, in a subquery ``ORDER BY key FOR
UPDATE``. MySQL/MariaDB lock rows as they read them, in the order of the index
read: the sweep reads the primary key (its condition leaves no other index),
and the refresh is told to (``FORCE INDEX (PRIMARY)``), since through the
``expires_at`` index it would lock that index's entry of a row before the row.
SQLite has one writer at a time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence, Set
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import F, Q, sql
from django.db.models.functions import Least
from django.utils.dateparse import parse_datetime

from django_tasklock.backends.base import STALE_AFTER, Refresh, storage_key
from django_tasklock.backends.database import timeouts
from django_tasklock.backends.database.functions import AsUtc, UtcNow, aware_utc
from django_tasklock.backends.database.notifications import notifying
from django_tasklock.backends.database.timeouts import REFRESH_TIMEOUT as REFRESH_TIMEOUT

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models import QuerySet

    from django_tasklock.models import CacheEntry

#: Most leases one refresh statement carries.
REFRESH_CHUNK = 500

_KEY, _TOKEN = "\x00tasklock-key\x00", "\x00tasklock-token\x00"


class Release:
    """The release DELETE of one connection, compiled once: ``run(key, token)`` -> rows deleted."""

    def __init__(self, model: type[CacheEntry], alias: str, *, live_only: bool) -> None:
        rows = model.objects.using(alias).filter(key=_KEY, value=_TOKEN)
        if live_only:
            rows = rows.filter(expires_at__gt=UtcNow())
        query = rows.query.chain(sql.DeleteQuery)
        self.sql, params = query.get_compiler(alias).as_sql()
        positions = {_KEY: 0, _TOKEN: 1}
        self._order = [positions[p] for p in params]  # where the key and the token go
        self.engine = connections[alias].settings_dict["ENGINE"]
        #: What :meth:`run` sends: on PostgreSQL, :attr:`sql` that also wakes the
        #: key's waiters in other processes (``notifications``).
        self.statement = (
            notifying(self.sql) if connections[alias].vendor == "postgresql" else self.sql
        )

    def params(self, stored: str, token: str) -> list[str]:
        """The parameters of :attr:`sql` for this key and token, in the compiler's order."""
        values = (stored, token)
        return [values[i] for i in self._order]

    def run(self, alias: str, stored: str, token: str) -> int:
        with connections[alias].cursor() as cursor:
            cursor.execute(self.statement, self.params(stored, token))
            return int(cursor.rowcount)


class _KeyLook:
    """A SELECT of one key's row, compiled once: its SQL, and where the key goes among its
    parameters. Only the SQL is kept (no compiler, which would keep the compiling
    thread's connection alive)."""

    def __init__(self, rows: QuerySet[Any], alias: str) -> None:
        self.sql, params = rows.query.get_compiler(alias).as_sql()
        self._params = list(params)
        self._key_at = [i for i, param in enumerate(self._params) if param == _KEY]
        self.engine = connections[alias].settings_dict["ENGINE"]

    def _row(self, alias: str, stored: str) -> tuple[Any, ...] | None:
        params = list(self._params)
        for i in self._key_at:
            params[i] = stored
        with connections[alias].cursor() as cursor:
            cursor.execute(self.sql, params)
            row: tuple[Any, ...] | None = cursor.fetchone()
        return row


class Peek(_KeyLook):
    """The look at one key's live row, compiled once per connection: ``run(key)`` -> row.

    ``rows.live`` filtered by the key, read as (key, token, acquired, expires,
    server's now), the times as ``AsUtc`` gives them. Compiling the queryset
    cost a waiter more than the SELECT itself. The times come back as
    ``datetime`` or, on SQLite, as text, parsed here (their zone is set by
    ``rows.held_values``).
    """

    def __init__(self, model: type[CacheEntry], alias: str) -> None:
        from django_tasklock.backends.database.rows import live

        rows = (
            live(model, alias)
            .filter(key=_KEY)
            .values_list(
                "key",
                "value",
                "utc_created",
                "utc_expires",
                "server_now",  # type: ignore[misc]
            )[:1]
        )
        super().__init__(rows, alias)

    def run(self, alias: str, stored: str) -> tuple[str, str, datetime, datetime, datetime] | None:
        row = self._row(alias, stored)
        if row is None:
            return None
        key, token, *times = row
        created, expires, now = (_moment(value) for value in times)
        return key, token, created, expires, now


class HolderLook(_KeyLook):
    """The look at one key's row, live or not, compiled once per database: ``run(key)`` ->
    (the row's token, whether the row is live) or None when there is no row.

    For an acquisition whose INSERT found the key held: one look says whose
    the row is and whether it is free to take over, by the server's clock
    (live as ``rows`` judges it). Compiled at every look, the queryset cost a
    caller that found the key held more CPU than the INSERT and the SELECT
    together (0.9 ms of 2 ms on PostgreSQL here; a waiter woken with others
    pays it while the winner takes the key).
    """

    def __init__(self, model: type[CacheEntry], alias: str) -> None:
        rows = (
            model.objects.using(alias)
            .filter(key=_KEY)
            .values_list("value", AsUtc("expires_at"), AsUtc("created_at"), AsUtc(UtcNow()))[:1]
        )
        super().__init__(rows, alias)

    def run(self, alias: str, stored: str) -> tuple[str, bool] | None:
        row = self._row(alias, stored)
        if row is None:
            return None
        token, *times = row
        expires, created, now = (aware_utc(_moment(value)) for value in times)
        return token, expires > now and created > now - STALE_AFTER


def _moment(value: datetime | str) -> datetime:
    if isinstance(value, datetime):
        return value
    parsed = parse_datetime(value)
    if parsed is None:  # pragma: no cover - never from AsUtc
        raise ValueError(f"not a time: {value!r}")
    return parsed


Row = tuple[str, str, timedelta, timedelta]  # stored key, token, ttl, max_lifetime


class Batch:
    """What a refresh of ``items`` sends, built once: the rows, and PostgreSQL's payloads.

    The heartbeat passes the same tuple of leases tick after tick while none
    is added or released; the backend keeps its ``Batch`` for it, so that
    10,000 leases are not turned into rows and JSON again every second.
    ``skip``: (stored key, token) pairs left out (leases of a ``TestCase``).
    """

    def __init__(self, items: Sequence[Refresh], skip: set[tuple[str, str]]) -> None:
        self.items = items
        self.stored = [storage_key(item.key) for item in items]
        #: (stored key, token) per item, in order: how the answer names each.
        self.pairs = [(key, item.token) for key, item in zip(self.stored, items, strict=True)]
        self.rows: list[Row] = [
            (key, item.token, item.ttl, item.max_lifetime)
            for key, item in zip(self.stored, items, strict=True)
            if not skip or (key, item.token) not in skip
        ]
        self.payloads: dict[int, str] = {}  # PostgreSQL's JSON per chunk, by its first row
        self.sent: dict[int, frozenset[tuple[str, str]]] = {}  # its pairs, the same way
        #: Whether every item is sent, and no (stored key, token) pair twice.
        self.whole = len(self.rows) == len(self.pairs) == len(set(self.pairs))

    def answers(self, ours: set[tuple[str, str]], *, exact: bool) -> list[bool]:
        """Per item, whether still ours, given the pairs the storage said are ``ours``.

        ``exact``: ``ours`` holds only pairs sent, spelled as sent (PostgreSQL's
        ``RETURNING``, matched by ``=``): then as many as were sent, all different,
        means every one, with no look at each.
        """
        if exact and self.whole and len(ours) == len(self.pairs):
            return [True] * len(self.pairs)
        return [pair in ours for pair in self.pairs]


def refresh(
    model: type[CacheEntry],
    alias: str,
    rows: Sequence[Row],
    payloads: dict[int, str] | None = None,
    sent: dict[int, frozenset[tuple[str, str]]] | None = None,
) -> set[tuple[str, str]]:
    """Extend ``rows`` where still held by their token: the (stored key, token) pairs still ours.

    One statement per chunk (per ttl and cap outside PostgreSQL), under the
    refresh timeout (see ``timeouts``). ``payloads``: PostgreSQL's JSON of each
    chunk, filled on first use and reused (see :class:`Batch`); ``sent``, the
    same for each chunk's pairs.
    """
    connection = connections[alias]
    ours: set[tuple[str, str]] = set()
    if connection.vendor == "postgresql":
        known = {} if payloads is None else payloads
        kept = {} if sent is None else sent
        for start in range(0, len(rows), REFRESH_CHUNK):
            chunk = rows[start : start + REFRESH_CHUNK]
            payload = known.get(start)
            if payload is None:
                payload = known[start] = postgres_payload(chunk)
            found: Set[tuple[str, str]] = refresh_postgres(model, alias, chunk, payload)
            if len(found) == len(chunk):
                # Every pair sent (so all different): ``RETURNING`` names only
                # rows sent, each once, spelled as sent (matched by ``=``). The
                # pairs kept from the first time, not the ones just read: those
                # die young, and 10,000 leases' answers do not pile up for the
                # collector's full pass.
                chunk_pairs = kept.get(start)
                if chunk_pairs is None:
                    chunk_pairs = kept[start] = frozenset(found)
                found = chunk_pairs
            ours |= found
        return ours
    groups: dict[tuple[timedelta, timedelta], list[tuple[str, str]]] = {}
    for key, token, ttl, cap in rows:
        groups.setdefault((ttl, cap), []).append((key, token))
    for (ttl, cap), pairs in groups.items():
        for pairs_chunk in chunks(pairs, portable_chunk(connection)):
            ours |= refresh_portable(model, alias, pairs_chunk, ttl=ttl, max_lifetime=cap)
    return ours


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def postgres_payload(rows: Sequence[Row]) -> str:
    """``rows`` as the one JSON text :func:`refresh_postgres` sends."""
    # One JSON text, not four arrays: the driver then quotes one string instead
    # of each element, which was most of the heartbeat's CPU for many leases.
    seconds: dict[timedelta, float] = {}
    return json.dumps(
        [
            [
                key,
                token,
                seconds.get(ttl) or seconds.setdefault(ttl, ttl.total_seconds()),
                seconds.get(cap) or seconds.setdefault(cap, cap.total_seconds()),
            ]
            for key, token, ttl, cap in rows
        ]
    )


def refresh_postgres(
    model: type[CacheEntry], alias: str, rows: Sequence[Row], payload: str | None = None
) -> set[tuple[str, str]]:
    """One UPDATE for ``rows`` of (stored key, token, ttl, max_lifetime): the pairs still ours.

    ``payload``: :func:`postgres_payload` of ``rows``, if already made.
    """
    connection = connections[alias]
    quote = connection.ops.quote_name
    table, key, value = quote(model._meta.db_table), quote("key"), quote("value")
    expires = quote("expires_at")
    # The rows still ours are locked first, in key order (an UPDATE has no
    # ORDER BY; its join would meet them in the order sent or of the pages).
    statement = (
        f"UPDATE {table} AS e SET {expires} = LEAST("
        "STATEMENT_TIMESTAMP() + make_interval(secs => o.t), "
        f"e.{quote('created_at')} + make_interval(secs => o.c)) "
        f"FROM (SELECT h.{key}, u.t, u.c FROM {table} AS h JOIN ("
        "SELECT x->>0 AS k, x->>1 AS v, (x->>2)::float8 AS t, (x->>3)::float8 AS c "
        "FROM json_array_elements(%s::json) AS x) AS u "
        f"ON h.{key} = u.k AND h.{value} = u.v "
        f"WHERE h.{expires} > STATEMENT_TIMESTAMP() "
        f"ORDER BY h.{key} FOR NO KEY UPDATE OF h) AS o "
        f"WHERE e.{key} = o.{key} "
        f"RETURNING e.{key}, e.{value}"
    )
    if payload is None:
        payload = postgres_payload(rows)
    # One query, one implicit transaction: the timeout ends with it.
    timeout = timeouts.postgres_prefix(connection)
    with timeouts.client_side_cursor(connection) as cursor:
        cursor.execute(timeout + statement, [payload])
        if timeout and _psycopg3():
            # psycopg 3 stops at the SET's empty result; psycopg2 has only the
            # last statement's rows (and rejects nextset()).
            cursor.nextset()
        return set(map(tuple, cursor.fetchall()))  # (key, value) rows


def _psycopg3() -> bool:
    """Whether Django's PostgreSQL backend runs on psycopg 3 (else psycopg2)."""
    # Imported here: the module needs a PostgreSQL driver installed.
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def refresh_portable(
    model: type[CacheEntry],
    alias: str,
    rows: Sequence[tuple[str, str]],
    *,
    ttl: timedelta,
    max_lifetime: timedelta,
) -> set[tuple[str, str]]:
    """One UPDATE for ``rows`` of (stored key, token) sharing a ttl and cap: the pairs still ours.

    When every row was updated that is the answer; otherwise one SELECT of the
    rows still ours and live says which (a row the UPDATE extended stays live).
    On MariaDB the UPDATE runs under the refresh timeout; the SELECT, a
    consistent read, waits for no row lock.
    """
    ours = Q(*(Q(key=key, value=token) for key, token in rows), _connector=Q.OR)
    live = model.objects.using(alias).filter(ours, expires_at__gt=UtcNow())
    extend = Least(UtcNow() + ttl, F("created_at") + max_lifetime)
    if connections[alias].vendor == "mysql":
        updated = update_by_primary_key(live, alias, expires_at=extend)
    else:
        updated = live.update(expires_at=extend)
    if updated == len(rows):
        return set(rows)
    return set(live.values_list("key", "value"))


def update_by_primary_key(rows: QuerySet[CacheEntry], alias: str, **values: Any) -> int:
    """MySQL/MariaDB: ``rows.update(**values)`` read through the primary key, in its order.

    Through the ``expires_at`` index (the optimizer's pick on a small table)
    InnoDB would lock that index's entry of each row before the row itself,
    the opposite of a DELETE, which locks the row and then its index entries.
    On MariaDB the statement carries the refresh timeout (see ``timeouts``).
    """
    query = rows.query.chain(sql.UpdateQuery)
    assert isinstance(query, sql.UpdateQuery)
    query.add_update_values(values)
    statement, params = query.get_compiler(alias).as_sql()
    table = connections[alias].ops.quote_name(rows.model._meta.db_table)
    head = f"UPDATE {table} SET "
    if not statement.startswith(head):  # pragma: no cover - Django changed its UPDATE
        raise AssertionError(f"unexpected UPDATE: {statement[:80]}")
    timeout = timeouts.mariadb_prefix(connections[alias])
    statement = f"{timeout}UPDATE {table} FORCE INDEX (PRIMARY) SET {statement[len(head) :]}"
    with connections[alias].cursor() as cursor:
        cursor.execute(statement, params)
        return int(cursor.rowcount)


def delete_in_key_order(rows: QuerySet[CacheEntry], alias: str) -> int:
    """Delete ``rows`` in one statement; on PostgreSQL locking them first, in key order.

    A stale row that its holder refreshes meanwhile is waited for, then
    judged again as it is now, as a plain DELETE would: it is not deleted or
    counted if it is no longer stale. Elsewhere this is ``_raw_delete``.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return int(rows._raw_delete(alias))
    quote = connection.ops.quote_name
    table, key = quote(rows.model._meta.db_table), quote("key")
    chosen, params = rows.order_by().values("key").query.get_compiler(alias).as_sql()
    statement = f"DELETE FROM {table} WHERE {key} IN ({chosen} ORDER BY {key} FOR UPDATE)"
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return int(cursor.rowcount)


def portable_chunk(connection: BaseDatabaseWrapper) -> int:
    """Leases per portable UPDATE: two parameters each, within the database's limit."""
    limit = connection.features.max_query_params
    return REFRESH_CHUNK if limit is None else max(1, min(REFRESH_CHUNK, limit // 2 - 8))
