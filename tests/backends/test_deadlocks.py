"""A lock statement chosen as a deadlock victim on its own connection is sent again.

The line-up: two leases, LOW and HIGH (by key). Another transaction holds
HIGH; a batch refresh of both, inside the caller's ``atomic()`` (so on the
side connection), locks LOW and waits for HIGH; then the other transaction
asks for LOW. That is a deadlock, and the server cancels one of the two: here
always the refresh (PostgreSQL: the other transaction waits longer before it
looks for deadlocks; MariaDB: InnoDB cancels the transaction that wrote less,
and the other one wrote 50 rows). The refresh's statement, on its own
autocommit connection, was rolled back whole: it is sent again, and waits for
the other transaction instead.

Under a Django ``TestCase`` the lock's statements run in the test's own
transaction; there the deadlock reaches the caller, whose transaction it is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connections, transaction

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import Refresh, storage_key
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.functions import UtcNow
from django_tasklock.models import CacheEntry
from django_tasklock.testing.support import wait_until
from tests.conftest import require_service
from tests.support.row_waits import innodb_row_waits

pytestmark = pytest.mark.databases

LONG, LIFE = timedelta(minutes=1), timedelta(hours=1)
LOW, HIGH = 0, 1
#: PostgreSQL: how long the refresh's session waits before it looks for a
#: deadlock; the other transaction must close the cycle within it.
REFRESH_DEADLOCK_TIMEOUT = "3s"


class _Refresher:
    """``backend.refresh_many(items)`` inside ``atomic()`` on a thread of its own."""

    def __init__(self, backend: DatabaseBackend, items: list[Refresh], *, in_test: bool) -> None:
        self.out: list[Any] = []
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(backend, items, in_test))
        self._thread.start()

    def _run(self, backend: DatabaseBackend, items: list[Refresh], in_test: bool) -> None:
        try:
            with transaction.atomic(using=backend.using):
                if in_test:  # what Django's TestCase marks its own transaction with
                    block = connections[backend.using].atomic_blocks[0]
                    block._from_testcase = True  # type: ignore[attr-defined]
                self.out.append(backend.refresh_many(items))
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            connections.close_all()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> Any:
        self._thread.join(60)
        assert not self._thread.is_alive(), "the refresh never finished"
        if self.errors:
            raise self.errors[0]
        return self.out[0]


def _someone_waits_for_me(alias: str, refresher: _Refresher) -> bool:
    """Whether a statement of another session waits for a row lock of this one."""
    if refresher.done():
        raise AssertionError(f"the refresh did not wait: {refresher.errors or refresher.out}")
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted"
                " AND pg_backend_pid() = ANY(pg_blocking_pids(pid)))"
            )
            return bool(cursor.fetchone()[0])
        # MariaDB: a row lock of this test's table waited for (nothing else runs on its database).
        table = f"of table `{connection.settings_dict['NAME']}`.`{CacheEntry._meta.db_table}`"
        return any(table in wait.lock for wait in innodb_row_waits(connection))


@contextmanager
def _the_refresh_looks_first(alias: str) -> Iterator[None]:
    """PostgreSQL: new sessions (the side connection's) look for deadlocks before ours does."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        yield
        return
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER DATABASE {name} SET deadlock_timeout = '{REFRESH_DEADLOCK_TIMEOUT}'"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} RESET deadlock_timeout")


def _make_heavy(alias: str, key: str) -> None:
    """This transaction: the one not to cancel (PostgreSQL: waits long; MariaDB: wrote more)."""
    if connections[alias].vendor == "postgresql":
        with connections[alias].cursor() as cursor:
            cursor.execute("SET LOCAL deadlock_timeout = '60s'")
        return
    CacheEntry.objects.using(alias).bulk_create(
        CacheEntry(key=f"weight-{key}-{n}", value="x", expires_at=UtcNow(), created_at=UtcNow())
        for n in range(50)
    )


@pytest.mark.parametrize("alias", ["postgres", "mariadb"])
@pytest.mark.parametrize("in_test", [False, True], ids=["side-connection", "test-transaction"])
def test_a_deadlock_victim_is_sent_again_unless_in_the_callers_transaction(
    alias: str, in_test: bool, key: str
) -> None:
    require_service(alias)
    backend = DatabaseBackend(using=alias)
    names = (f"{key}-a", f"{key}-b")
    stored = [storage_key(name) for name in names]
    tokens = [new_token() for _ in names]
    for name, token in zip(names, tokens, strict=True):
        assert backend.acquire(name, token, ttl=LONG, max_lifetime=LIFE)
    items = [Refresh(name, token, LONG, LIFE) for name, token in zip(names, tokens, strict=True)]
    rows = CacheEntry.objects.using(alias)
    try:
        with _the_refresh_looks_first(alias), transaction.atomic(using=alias):
            _make_heavy(alias, key)
            rows.select_for_update().get(key=stored[HIGH])
            refresher = _Refresher(backend, items, in_test=in_test)
            wait_until(lambda: _someone_waits_for_me(alias, refresher), timeout=30, step=0.1)
            rows.select_for_update().get(key=stored[LOW])  # closes the cycle
            transaction.set_rollback(True, using=alias)
        if in_test:
            with pytest.raises(OperationalError, match=r"(?i)deadlock"):
                refresher.result()
        else:
            assert refresher.result() == [True, True]
    finally:
        for name, token in zip(names, tokens, strict=True):
            backend.release(name, token)
