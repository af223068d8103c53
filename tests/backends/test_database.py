"""What only the database backend does: round trips, transactions, real errors."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import IntegrityError, connections, transaction

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.exceptions import TaskLockError
from django_tasklock.models import CacheEntry
from django_tasklock.testing.support import wait_until
from tests.conftest import DATABASE_ALIASES, require_service

pytestmark = pytest.mark.databases

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


@pytest.fixture(params=["default", "postgres", "mariadb"], ids=["sqlite", "postgres", "mariadb"])
def alias(request: pytest.FixtureRequest) -> str:
    if request.param not in DATABASE_ALIASES:
        require_service(request.param)
    return str(request.param)


def _statements_sent(alias: str, work: Any) -> list[str]:
    """What the client sent PostgreSQL while ``work()`` ran, read off libpq's trace."""
    from psycopg.pq import Trace

    connection = connections[alias]
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        try:
            work()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().splitlines()
    sent = [line.split("\t") for line in lines if line.startswith("F\t")]
    return [parts[3] if len(parts) > 3 else parts[2] for parts in sent]


def _kinds(statements: list[str]) -> list[str]:
    """The first word of each statement: INSERT, BEGIN, ...; of a ``WITH name AS (...)``,
    the statement it runs (the release's DELETE, which notifies waiters from there)."""
    words = []
    for text in statements:
        text = re.sub(r"^\s*\"?WITH \w+ AS \(", "", text, flags=re.IGNORECASE)
        words.append(re.sub(r"^\s*\"?(\w+).*", r"\1", text).upper())
    return words


def test_refused_acquisition_is_one_insert_and_one_select_on_postgres() -> None:
    require_service("postgres")
    backend = DatabaseBackend(using="postgres")
    assert backend.acquire("refused", new_token(), ttl=LONG, max_lifetime=LIFE)
    sent = _statements_sent(
        "postgres",
        lambda: backend.acquire("refused", new_token(), ttl=LONG, max_lifetime=LIFE),
    )
    assert _kinds(sent) == ["INSERT", "SELECT"], sent


def test_uncontended_run_is_one_insert_and_one_delete_on_postgres() -> None:
    require_service("postgres")
    service = TaskLockService(DatabaseBackend(using="postgres"))
    service.run_exclusive("warm-up", lambda: None)  # connect outside the measurement
    sent = _statements_sent("postgres", lambda: service.run_exclusive("rt", lambda: None))
    assert _kinds(sent) == ["INSERT", "DELETE"], sent
    assert all("cache_entries" in text for text in sent)


@pytest.fixture(params=["postgres", "mariadb"])
def server_alias(request: pytest.FixtureRequest) -> str:
    """A database with a server (PostgreSQL, MariaDB): where a side connection works."""
    require_service(request.param)
    return str(request.param)


def test_lock_inside_a_transaction_is_visible_at_once_and_survives_rollback(
    server_alias: str,
) -> None:
    alias = server_alias
    backend = DatabaseBackend(using=alias)
    seen_by_others: list[bool] = []

    def other_worker() -> None:
        started = time.monotonic()
        seen_by_others.append(
            not backend.acquire("in-tx", new_token(), ttl=LONG, max_lifetime=LIFE)
        )
        seen_by_others.append(time.monotonic() - started < 2)
        backend.close()

    def work() -> str:
        thread = threading.Thread(target=other_worker)
        thread.start()
        thread.join()
        return "done"

    with transaction.atomic(using=alias):
        result = TaskLockService(backend).run_exclusive("in-tx", work)
        assert connections[alias].in_atomic_block
        transaction.set_rollback(True, using=alias)
    assert (result.acquired, result.result, result.lost) == (True, "done", False)
    assert seen_by_others == [True, True]  # refused at once, not blocked until commit
    deadline = time.monotonic() + 8
    while backend.peek("in-tx") is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    # Released after the rollback (by the heartbeat), long before its ttl.
    assert not CacheEntry.objects.using(alias).filter(key="task-lock:in-tx").exists()


def test_lease_taken_inside_a_transaction_is_committed_before_the_caller_commits(
    server_alias: str,
) -> None:
    alias = server_alias
    backend = DatabaseBackend(using=alias)
    token = new_token()
    with transaction.atomic(using=alias):
        assert backend.acquire("committed", token, ttl=LONG, max_lifetime=LIFE)
        transaction.set_rollback(True, using=alias)
    assert backend.peek("committed") is not None
    assert backend.release("committed", token)


def test_without_autocommit_the_lease_is_committed_at_once_too(server_alias: str) -> None:
    backend = DatabaseBackend(using=server_alias)
    token = new_token()
    transaction.set_autocommit(False, using=server_alias)
    try:
        assert backend.acquire("no-autocommit", token, ttl=LONG, max_lifetime=LIFE)
        transaction.rollback(using=server_alias)
    finally:
        transaction.set_autocommit(True, using=server_alias)
    assert backend.peek("no-autocommit") is not None
    assert backend.release("no-autocommit", token)


def test_sqlite_refuses_a_lock_inside_a_transaction_and_writes_nothing() -> None:
    backend = DatabaseBackend(using="default")
    with transaction.atomic(using="default"):
        with pytest.raises(TaskLockError, match="SQLite"):
            backend.acquire("sqlite-tx", new_token(), ttl=LONG, max_lifetime=LIFE)
        assert backend.peek("sqlite-tx") is None  # reading is fine
    assert backend.peek("sqlite-tx") is None


def test_sqlite_refusal_under_atomic_requests_names_the_setting_and_the_way_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    backend = DatabaseBackend(using="default")
    with transaction.atomic(using="default"), pytest.raises(TaskLockError) as info:
        backend.acquire("sqlite-atomic-requests", new_token(), ttl=LONG, max_lifetime=LIFE)
    assert "ATOMIC_REQUESTS" in str(info.value)
    assert "@transaction.non_atomic_requests" in str(info.value)


def _wait_for_lock_waiters(alias: str, count: int) -> None:
    """Until ``count`` statements of the test database wait on a row lock."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with connections[alias].cursor() as cursor:
            # Activity is a snapshot per transaction, and we are in one.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0] >= count:
                return
        time.sleep(0.02)
    raise AssertionError(f"{count} statements never waited on the row lock")


def test_takeover_never_deletes_a_row_its_holder_has_just_extended(key: str) -> None:
    # A's refresh starts while the lease is live, B judges it expired, and B's
    # DELETE runs after A's refresh committed: a third connection's row lock
    # forces that order. B must not delete A's freshly extended row.
    # (PostgreSQL only: the order is observed through pg_stat_activity.)
    require_service("postgres")
    alias = "postgres"
    backend = DatabaseBackend(using=alias)
    holder = new_token()
    assert backend.acquire(key, holder, ttl=timedelta(seconds=1), max_lifetime=LIFE)
    outcome: dict[str, bool] = {}

    def run(name: str, work: Any) -> threading.Thread:
        def target() -> None:
            try:
                outcome[name] = work()
            finally:
                connections.close_all()

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    with transaction.atomic(using=alias):
        CacheEntry.objects.using(alias).select_for_update().get(key=f"task-lock:{key}")
        refresh = run(
            "refreshed", lambda: backend.refresh(key, holder, ttl=LONG, max_lifetime=LIFE)
        )
        _wait_for_lock_waiters(alias, 1)  # A's UPDATE, dated while the lease is live
        time.sleep(1.2)  # the lease expires by the server's clock
        takeover = run(
            "taken_over", lambda: backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        )
        _wait_for_lock_waiters(alias, 2)  # B's DELETE, behind A's UPDATE
    refresh.join(10)
    takeover.join(10)
    assert outcome == {"refreshed": True, "taken_over": False}
    assert backend.peek(key) is not None
    assert backend.release(key, holder)


def test_key_changing_hands_between_insert_and_look_is_held_not_an_error(alias: str) -> None:
    # Another worker releases between our INSERT's conflict and our look at
    # the row, again and again: a real duplicate-key error, and no row seen.
    backend = DatabaseBackend(using=alias)
    assert backend.acquire("churn", new_token(), ttl=LONG, max_lifetime=LIFE)
    with mock.patch("django.db.models.QuerySet.first", return_value=None):
        assert not backend.acquire("churn", new_token(), ttl=LONG, max_lifetime=LIFE)


def test_unknown_database_alias_is_improperly_configured() -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="TASKLOCK_DATABASE"):
        DatabaseBackend(using="nosuch").acquire("x", new_token(), ttl=LONG, max_lifetime=LIFE)


def test_integrity_error_without_the_row_is_raised_not_held(alias: str) -> None:
    backend = DatabaseBackend(using=alias)
    not_a_conflict = IntegrityError("NOT NULL constraint failed: cache_entries.value")
    with (
        mock.patch("django.db.models.QuerySet.create", side_effect=not_a_conflict),
        pytest.raises(IntegrityError, match="NOT NULL"),
    ):
        backend.acquire("ghost", new_token(), ttl=LONG, max_lifetime=LIFE)


class _CountingBackend(DatabaseBackend):
    """The database backend, counting the heartbeat's refreshes that came back."""

    answered = 0

    def refresh_many(self, items: Any) -> list[bool]:
        answers = super().refresh_many(items)
        self.answered += 1
        return answers


def test_refresh_after_the_connection_was_killed_reconnects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The heartbeat's connection killed: its next statement fails, it opens a new one.

    The failing statement is the refresh ("retrying") or, when the reap of
    dead holders falls between the kill and the refresh (every 5 s), the
    reap ("Reaping ... failed"), which closes the connection for the refresh.
    Either way the lease is kept.
    """
    require_service("postgres")
    backend = _CountingBackend(using="postgres")
    service = TaskLockService(backend)
    kills: list[int] = []

    def work() -> None:
        # The heartbeat has connected and refreshed.
        wait_until(lambda: backend.answered >= 1, timeout=30)
        with connections["postgres"].cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
            kills.append(len(cursor.fetchall()))
        noticed = ("retrying", "Reaping dead holders' task locks failed")
        wait_until(lambda: any(line in caplog.text for line in noticed), timeout=30)
        answered = backend.answered
        wait_until(lambda: backend.answered > answered, timeout=30)  # on a new connection
        assert not backend.acquire("killed-conn", new_token(), ttl=LONG, max_lifetime=LIFE)

    with caplog.at_level(logging.INFO, logger="django_tasklock"):
        result = service.run_exclusive("killed-conn", work, ttl=5.0, refresh_interval=0.3)
    assert kills
    assert kills[0] >= 1
    assert result.acquired
    assert not result.lost


def test_release_of_an_expired_own_row_reports_lost_and_clears_it(alias: str) -> None:
    backend = DatabaseBackend(using=alias)
    token = new_token()
    assert backend.acquire("expired-own", token, ttl=timedelta(seconds=0.2), max_lifetime=LIFE)
    time.sleep(0.3)
    assert not backend.release("expired-own", token)
    assert not CacheEntry.objects.using(alias).filter(key="task-lock:expired-own").exists()


def test_backend_without_the_app_installed_says_how_to_fix(
    settings: Any,
) -> None:
    from django.core.exceptions import ImproperlyConfigured

    backend = DatabaseBackend()
    with (
        mock.patch("django.apps.apps.is_installed", return_value=False),
        pytest.raises(ImproperlyConfigured, match="INSTALLED_APPS"),
    ):
        backend.acquire("x", new_token(), ttl=LONG, max_lifetime=LIFE)


def test_sqlite_test_database_is_a_file() -> None:
    # Other processes of the contract suite open it by name.
    assert os.path.exists(connections["default"].settings_dict["NAME"])
