"""Nothing of the lock is left on a connection the host application gets back.

Two ways the lock could leak into the host's connections:

* a session setting (the refresh's statement timeout) that outlives the lock's
  statement, on a connection Django, its pool or PgBouncer then hands to the
  application's next query;
* a write that joins a transaction of the caller's: with ``AUTOCOMMIT:
  False`` the caller's connection is in a transaction from its first
  statement, so a lease written through it would stay invisible to other
  workers (who would block on it) until the caller commits, and would vanish
  if the caller rolled back.

Each test reads the settings, or the lease, from where the host would meet them.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connections, transaction

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import Refresh, storage_key
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.connections import add_thread_connection
from django_tasklock.backends.database.timeouts import REFRESH_TIMEOUT
from django_tasklock.exceptions import TaskLockError
from django_tasklock.models import CacheEntry
from tests.conftest import DATABASE_ALIASES, require_service

pytestmark = pytest.mark.databases

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)
PG_SETTINGS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
MARIADB_SETTINGS = ("max_statement_time", "innodb_lock_wait_timeout", "lock_wait_timeout")


def _every_operation(backend: DatabaseBackend, key: str) -> None:
    """Each call of the database backend once, the heartbeat's batch refresh included."""
    token = new_token()
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    assert backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
    assert backend.refresh_many(
        [
            Refresh(key, token, ttl=LONG, max_lifetime=LIFE),
            Refresh(f"{key}-x", token, ttl=LONG, max_lifetime=LIFE),
        ]
    ) == [True, False]
    assert backend.fence(key, token) is not None
    assert backend.peek(key) is not None
    assert backend.list()
    backend.clear_stale()
    assert backend.release(key, token)
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    assert backend.force_release(key)


def _thread_alias(base: str, **changes: Any) -> Iterator[str]:
    """A thread-only alias of ``base``'s test database with ``changes`` to its settings."""
    name = f"{base}_{uuid.uuid4().hex[:8]}"
    settings_dict = dict(connections[base].settings_dict)
    options = {**settings_dict["OPTIONS"], **changes.pop("OPTIONS", {})}
    add_thread_connection(name, {**settings_dict, **changes, "OPTIONS": options})
    try:
        yield name
    finally:
        connections[name].close()
        del connections[name]
        _close_pool(name)


def _close_pool(alias: str) -> None:
    from django.db.backends.postgresql.base import DatabaseWrapper

    # Django 5.1+; before it there is no pool to close.
    pools: dict[str, Any] = getattr(DatabaseWrapper, "_connection_pools", {})
    if alias in pools:
        pools.pop(alias).close()


def _pg_settings(cursor: Any) -> dict[str, str]:
    values = {}
    for name in PG_SETTINGS:
        cursor.execute(f"SHOW {name}")
        values[name] = cursor.fetchone()[0]
    return values


# -- no session setting outlives its statement -----------------------------


@pytest.fixture
def server_defaults() -> dict[str, str]:
    """The settings a new PostgreSQL session of the test database starts with."""
    require_service("postgres")
    import psycopg

    params = connections["postgres"].get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as raw:
        return _pg_settings(raw.cursor())


@pytest.mark.parametrize(
    "server_side_binding", [False, True], ids=["client-binding", "server-binding"]
)
def test_pooled_connections_keep_no_setting_of_the_lock(
    server_side_binding: bool, server_defaults: dict[str, str], key: str
) -> None:
    import django

    if django.VERSION < (5, 1):
        pytest.skip("Django's connection pool is new in Django 5.1")
    size = 2
    for alias in _thread_alias(
        "postgres",
        CONN_MAX_AGE=0,
        OPTIONS={
            "pool": {"min_size": size, "max_size": size, "timeout": 10},
            "server_side_binding": server_side_binding,
        },
    ):
        backend = DatabaseBackend(using=alias)
        _every_operation(backend, key)
        with transaction.atomic(using=alias):  # the side connection, borrowed from the pool
            _every_operation(backend, key)
        connections[alias].close()  # handed back, as at the end of a request
        pool = connections[alias].pool  # type: ignore[attr-defined]  # PostgreSQL's
        borrowed = [pool.getconn(timeout=10) for _ in range(size)]  # every one it has
        try:
            for raw in borrowed:
                assert _pg_settings(raw.cursor()) == server_defaults
        finally:
            for raw in borrowed:
                pool.putconn(raw)


@pytest.mark.parametrize(
    "server_side_binding", [False, True], ids=["client-binding", "server-binding"]
)
def test_the_callers_own_connection_keeps_no_setting_of_the_lock(
    server_side_binding: bool, server_defaults: dict[str, str], key: str
) -> None:
    for alias in _thread_alias("postgres", OPTIONS={"server_side_binding": server_side_binding}):
        _every_operation(DatabaseBackend(using=alias), key)
        with connections[alias].cursor() as cursor:
            assert _pg_settings(cursor) == server_defaults


@pytest.mark.parametrize(
    "server_side_binding", [False, True], ids=["client-binding", "server-binding"]
)
def test_pgbouncers_server_connections_keep_no_setting_of_the_lock(
    server_side_binding: bool, server_defaults: dict[str, str], key: str
) -> None:
    import psycopg

    require_service("pgbouncer")
    assert "pgbouncer" in DATABASE_ALIASES
    for alias in _thread_alias("pgbouncer", OPTIONS={"server_side_binding": server_side_binding}):
        _every_operation(DatabaseBackend(using=alias), key)
        connections[alias].close()
        params = connections[alias].get_connection_params()
        params.pop("cursor_factory", None)
        params["prepare_threshold"] = None
        # Each client in a transaction holds a server connection of its own:
        # as many clients as the pool has servers see every one of them.
        clients = [psycopg.connect(**params) for _ in range(20)]
        try:
            for client in clients:
                assert _pg_settings(client.cursor()) == server_defaults
        finally:
            for client in clients:
                client.close()


def test_mariadb_connection_keeps_no_setting_of_the_lock(key: str) -> None:
    require_service("mariadb")
    for alias in _thread_alias("mariadb"):
        names = ", ".join(f"@@SESSION.{name}, @@GLOBAL.{name}" for name in MARIADB_SETTINGS)
        _every_operation(DatabaseBackend(using=alias), key)
        with connections[alias].cursor() as cursor:
            cursor.execute(f"SELECT {names}")
            values = cursor.fetchone()
        for n, name in enumerate(MARIADB_SETTINGS):
            assert values[2 * n] == values[2 * n + 1], name  # the session's is the server's


@pytest.mark.parametrize(
    ("base", "server_side_binding"),
    [("postgres", False), ("postgres", True), ("mariadb", False)],
    ids=["postgres-client-binding", "postgres-server-binding", "mariadb"],
)
def test_a_refresh_stuck_on_a_row_lock_is_still_cancelled(
    base: str, server_side_binding: bool, key: str
) -> None:
    require_service(base)
    options = {"server_side_binding": True} if server_side_binding else {}
    holder = DatabaseBackend(using=base)
    token = new_token()
    assert holder.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    errors: list[BaseException] = []

    def refresh() -> None:
        try:
            for alias in _thread_alias(base, OPTIONS=options):
                DatabaseBackend(using=alias).refresh_many(
                    [Refresh(key, token, ttl=LONG, max_lifetime=LIFE)]
                )
        except BaseException as exc:
            errors.append(exc)

    try:
        with transaction.atomic(using=base):
            CacheEntry.objects.using(base).select_for_update().get(key=storage_key(key))
            thread = threading.Thread(target=refresh)
            started = time.monotonic()
            thread.start()
            thread.join(REFRESH_TIMEOUT.total_seconds() * 4)
            took = time.monotonic() - started
        assert not thread.is_alive(), "the refresh waited past its timeout"
        assert len(errors) == 1, errors
        assert isinstance(errors[0], OperationalError), errors
        assert took >= REFRESH_TIMEOUT.total_seconds() - 0.5
    finally:
        holder.release(key, token)


# -- AUTOCOMMIT: False ------------------------------------------------------


@pytest.fixture(params=["default", "postgres", "mariadb"], ids=["sqlite", "postgres", "mariadb"])
def base(request: pytest.FixtureRequest) -> str:
    if request.param not in DATABASE_ALIASES:
        require_service(request.param)
    return str(request.param)


@pytest.mark.parametrize("opened", [False, True], ids=["not-yet-open", "open"])
def test_with_autocommit_off_the_lease_is_committed_at_once(
    base: str, opened: bool, key: str
) -> None:
    other = DatabaseBackend(using=base)  # another worker, in autocommit
    for alias in _thread_alias(base, AUTOCOMMIT=False):
        caller = connections[alias]
        if opened:
            caller.ensure_connection()
        backend = DatabaseBackend(using=alias)
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        try:
            seen = other.peek(key)
            assert seen is not None, "the lease waits for the caller's commit"
            assert not other.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
            if caller.connection is not None:
                caller.rollback()  # the caller gives up its own work
            after = other.peek(key)  # the lease is not the caller's to roll back
            assert after is not None
            assert after.expires_at == seen.expires_at
            assert backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
            assert backend.fence(key, token) is not None
            assert backend.release(key, token)
            if caller.connection is not None:
                caller.rollback()
            assert other.peek(key) is None  # the release was committed too
        finally:
            if caller.connection is not None:
                caller.rollback()
            other.force_release(key)


@pytest.mark.parametrize("base", ["postgres", "mariadb"])
def test_with_autocommit_off_a_lease_taken_inside_atomic_is_committed_at_once(
    base: str, key: str
) -> None:
    # The side connection is in autocommit whatever the settings say: one that
    # inherited AUTOCOMMIT: False would lose its INSERT when it was closed.
    require_service(base)
    other = DatabaseBackend(using=base)
    for alias in _thread_alias(base, AUTOCOMMIT=False):
        backend = DatabaseBackend(using=alias)
        token = new_token()
        try:
            with transaction.atomic(using=alias):
                assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
                assert other.peek(key) is not None, "the lease waits for the caller's commit"
                transaction.set_rollback(True, using=alias)
            assert other.peek(key) is not None  # not rolled back with the caller's work
            assert backend.release(key, token)
            assert other.peek(key) is None
        finally:
            connections[alias].rollback()
            other.force_release(key)


def test_sqlite_with_autocommit_off_and_a_write_pending_says_what_to_do(key: str) -> None:
    # SQLite has one writer: a lease written beside the caller's pending write
    # would wait for it, as inside atomic().
    from django_tasklock.backends.database.functions import UtcNow
    from django_tasklock.models import CacheEntry

    for alias in _thread_alias("default", AUTOCOMMIT=False):
        CacheEntry.objects.using(alias).create(
            key=f"pending-{key}", value="x", expires_at=UtcNow(), created_at=UtcNow()
        )
        backend = DatabaseBackend(using=alias)
        with pytest.raises(TaskLockError, match="transaction"):
            backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        connections[alias].rollback()
    assert DatabaseBackend(using="default").peek(key) is None
