"""The lock's extra statements on a database: fencing and min_hold, in and out of transactions."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.leases.lease import new_token
from django_tasklock.models import FenceCounter
from tests.backends.test_database import _kinds, _statements_sent
from tests.conftest import DATABASE_ALIASES, require_service

pytestmark = pytest.mark.databases

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


class PortableFences(DatabaseBackend):
    """The fence other databases (MySQL, MariaDB, ...) use, run here on ours."""

    single_statement_fence_vendors = ()


@pytest.fixture(params=["default", "postgres"], ids=["sqlite", "postgres"])
def alias(request: pytest.FixtureRequest) -> str:
    if request.param not in DATABASE_ALIASES:
        require_service("postgres")
    return str(request.param)


def test_fenced_run_costs_one_more_statement_on_postgres() -> None:
    require_service("postgres")
    service = TaskLockService(DatabaseBackend(using="postgres"))
    service.run_exclusive("warm-up", lambda: None)
    sent = _statements_sent(
        "postgres", lambda: service.run_exclusive("fenced-rt", lambda: None, fencing=True)
    )
    assert _kinds(sent) == ["INSERT", "INSERT", "DELETE"], sent
    assert "tasklock_fences" in sent[1]
    assert "FOR UPDATE" in sent[1]


def test_min_hold_release_is_one_update_on_postgres() -> None:
    require_service("postgres")
    service = TaskLockService(DatabaseBackend(using="postgres"))
    service.run_exclusive("warm-up", lambda: None)
    sent = _statements_sent(
        "postgres", lambda: service.run_exclusive("held-rt", lambda: None, min_hold=30)
    )
    assert _kinds(sent) == ["INSERT", "UPDATE"], sent


def test_portable_fence_counts_and_checks_the_holder(alias: str) -> None:
    backend = PortableFences(using=alias)
    fences = []
    for _ in range(3):
        token = new_token()
        assert backend.acquire("portable", token, ttl=LONG, max_lifetime=LIFE)
        assert backend.fence("portable", new_token()) is None
        fences.append(backend.fence("portable", token))
        assert backend.release("portable", token)
    assert fences == [1, 2, 3]
    assert backend.fence("portable", token) is None


def test_fence_taken_inside_a_rolled_back_transaction_is_never_handed_out_again() -> None:
    # Inside the caller's transaction the fence goes through the side
    # connection, like the lease: the caller's rollback cannot undo it.
    require_service("postgres")
    backend = DatabaseBackend(using="postgres")
    service = TaskLockService(backend)
    fences: list[int | None] = []

    def fenced_then_rolled_back() -> None:
        with transaction.atomic(using="postgres"):
            with service.lock("rolled-back", fencing=True) as lock:
                fences.append(lock.fence)
            raise RuntimeError("roll back")

    try:
        with pytest.raises(RuntimeError, match="roll back"):
            fenced_then_rolled_back()
    finally:
        backend.close()  # the side connection the transaction made
    # The lease itself is held until the rollback is noticed (within a second).
    after = service.run_exclusive("rolled-back", lambda: None, fencing=True, wait=5)
    assert fences[0] is not None
    assert after.fence is not None
    assert after.fence > fences[0]
    assert FenceCounter.objects.using("postgres").get(key="rolled-back").value == after.fence


def test_fencing_before_migrating_the_fence_table_says_to_migrate(tmp_path: Path) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections

    from django_tasklock.backends.database.connections import add_thread_connection
    from django_tasklock.models import CacheEntry

    # A database migrated before fencing existed: cache_entries only.
    older = {**connections["default"].settings_dict, "NAME": str(tmp_path / "older.sqlite3")}
    add_thread_connection("older", older)
    try:
        with connections["older"].schema_editor() as editor:
            editor.create_model(CacheEntry)
        service = TaskLockService(DatabaseBackend(using="older"))
        with pytest.raises(ImproperlyConfigured, match=r"tasklock_fences table .* migrate"):
            service.run_exclusive("k", lambda: None, fencing=True)
        assert service.peek("k") is None  # the lease is not left behind
    finally:
        connections["older"].close()


def test_an_older_sqlite_gets_the_portable_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    # SQLite before 3.35 has no RETURNING; the version is the one thing faked.
    from django.db import connections

    from django_tasklock.backends.database.fences import upsert_returns

    sqlite = connections["default"]
    module = sqlite.Database  # type: ignore[attr-defined]  # the DB-API module
    assert upsert_returns(sqlite) == (module.sqlite_version_info >= (3, 35))
    monkeypatch.setattr(module, "sqlite_version_info", (3, 31, 1))
    assert not upsert_returns(sqlite)
    service = TaskLockService(DatabaseBackend(using="default"))
    fences = [service.run_exclusive("old-sqlite", lambda: None, fencing=True).fence for _ in "ab"]
    assert fences == [1, 2]
