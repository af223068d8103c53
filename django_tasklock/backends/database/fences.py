"""Fencing tokens for the database backend: a counter per key in ``tasklock_fences``.

The counter lives in its own table, not in ``cache_entries``, so that nothing
that sweeps lock rows (expiry, the 24 h cap, ``clear_stale``, a force release)
can reset it. It is incremented only while the asking token holds the key's
live lease, in one atomic step with that check: a holder paused between
acquiring and fencing must never get a number above its successor's.

The counters are as durable as the database's other rows, and that is the
promise: a truncated table, a backup restored from before a key's last
grant, or a failover that lost commits starts them again lower (docs/fencing.md
says so). Redis, whose data may vanish on a restart, floors its fences at
the server's clock instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import connections, transaction
from django.db.models import F

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models import QuerySet

    from django_tasklock.models import CacheEntry


def upsert_returns(connection: BaseDatabaseWrapper) -> bool:
    """``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` works here (SQLite from 3.35)."""
    if connection.vendor == "sqlite":
        database = connection.Database  # type: ignore[attr-defined]  # the DB-API module
        return bool(database.sqlite_version_info >= (3, 35))
    return True


def next_fence_upsert(alias: str, key: str, held: QuerySet[CacheEntry]) -> int | None:
    """One statement: an upsert of the counter guarded by ``EXISTS`` on the lease row.

    PostgreSQL locks the lease row ``FOR UPDATE``, so a successor's takeover
    (which deletes that row) waits for this statement, and a row deleted
    meanwhile is re-checked and found gone. SQLite has one writer at a time.
    """
    from django_tasklock.models import FenceCounter

    connection = connections[alias]
    quote = connection.ops.quote_name
    table, key_col, value_col = (
        quote(FenceCounter._meta.db_table),
        quote("key"),
        quote("value"),
    )
    exists_sql, exists_params = held.values("key").query.get_compiler(alias).as_sql()
    lock_row = " FOR UPDATE" if connection.vendor == "postgresql" else ""
    sql = (
        f"INSERT INTO {table} ({key_col}, {value_col}) "
        f"SELECT %s, 1 WHERE EXISTS ({exists_sql}{lock_row}) "
        f"ON CONFLICT ({key_col}) DO UPDATE SET {value_col} = {table}.{value_col} + 1 "
        f"RETURNING {value_col}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, (key, *exists_params))
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def next_fence_in_transaction(alias: str, key: str, held: QuerySet[CacheEntry]) -> int | None:
    """Any database: lock the lease row, then bump (or create) the counter, in a transaction."""
    from django_tasklock.models import FenceCounter

    counters = FenceCounter.objects.using(alias)
    with transaction.atomic(using=alias):
        if not held.select_for_update().exists():
            return None
        # The locked lease row keeps every other holder of the key out until
        # this commits, so nobody else can create the counter meanwhile.
        if not counters.filter(key=key).update(value=F("value") + 1):
            counters.create(key=key, value=1)
        return int(counters.values_list("value", flat=True).get(key=key))
