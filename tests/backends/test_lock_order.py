"""Multi-row writes lock their rows in key order, so a sweep and the heartbeat never deadlock.

``clear_stale`` (one DELETE) and the heartbeat's batch refresh (one UPDATE per
chunk) can meet the same rows: abandoned leases still unexpired, or leases
expiring while a refresh waits. Two statements locking shared rows in
different orders can deadlock; PostgreSQL then cancels one of them
(``deadlock detected``), MySQL/MariaDB too (error 1213).

Each test lines the two statements up on two such rows: a transaction holds
one row, the sweep queues on it, then the refresh starts. Had the refresh
locked the other row first, the sweep would wait on the refresh once it got
the held row, and the refresh on the sweep. Each line-up holds the row that an
old statement met first and sends the refresh the keys in the order that old
statement would have locked the other row first:

* ``refresh-meets-rows-as-sent``: the refresh used to lock rows in the order
  it was sent them (PostgreSQL, a small table), or through the ``expires_at``
  index, which on MariaDB locks a row's index entry before the row;
* ``sweep-meets-rows-by-page``: the sweep used to lock rows in the order of
  the table's pages (PostgreSQL, when it reads the whole table, as on a table
  of many locks), here written in reverse key order.

A deadlock would be retried and go unseen, so retries are off.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import Refresh, storage_key
from django_tasklock.backends.database import DatabaseBackend, retries
from django_tasklock.backends.database.functions import UtcNow
from django_tasklock.models import CacheEntry
from django_tasklock.testing.support import wait_until
from tests.conftest import require_service
from tests.support.row_waits import innodb_row_waits

pytestmark = pytest.mark.databases

LOW, HIGH = 0, 1  # the two rows, by key


@dataclasses.dataclass(frozen=True)
class Lineup:
    written: tuple[int, int]  # the order the rows are inserted in
    held: int  # the row a third transaction holds
    sent: tuple[int, int]  # the order the refresh is given the leases in
    sweep_reads_pages: bool  # PostgreSQL: the sweep reads the table's pages, not the key index


LINEUPS = {
    "refresh-meets-rows-as-sent": Lineup((LOW, HIGH), LOW, (HIGH, LOW), sweep_reads_pages=False),
    "sweep-meets-rows-by-page": Lineup((HIGH, LOW), HIGH, (LOW, HIGH), sweep_reads_pages=True),
}


class _Worker:
    """``work()`` on a thread with its own connection, whose server-side id it reports."""

    def __init__(self, alias: str, work: Callable[[], Any], setup: str | None = None) -> None:
        self.alias = alias
        self.work = work
        self.setup = setup
        self.session: int | None = None
        self.out: list[Any] = []
        self.errors: list[BaseException] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        assert self._ready.wait(30), "the worker never connected"

    def _run(self) -> None:
        try:
            connection = connections[self.alias]
            with connection.cursor() as cursor:
                if self.setup:
                    cursor.execute(self.setup)
                if connection.vendor == "postgresql":
                    cursor.execute("SELECT pg_backend_pid()")
                else:
                    cursor.execute("SELECT CONNECTION_ID()")
                self.session = int(cursor.fetchone()[0])
            self._ready.set()
            self.out.append(self.work())
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self._ready.set()
            connections.close_all()  # with it, any setting the setup made

    def waiting(self) -> bool:
        """Whether the worker's statement waits for a row lock."""
        if self.errors or self.out:
            raise AssertionError(f"the statement did not wait: {self.errors or self.out}")
        connection = connections[self.alias]
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [self.session])
                return bool(cursor.fetchone()[0])
        return any(wait.thread_id == self.session for wait in innodb_row_waits(connection))

    def result(self) -> Any:
        self._thread.join(60)
        assert not self._thread.is_alive(), "the statement never finished"
        if self.errors:
            raise self.errors[0]
        return self.out[0]


def _waits(worker: _Worker) -> None:
    wait_until(worker.waiting, timeout=30, step=0.1)


def _plant_abandoned(alias: str, stored: str, token: str) -> None:
    """A lease taken 25 h ago and still unexpired: clear_stale sweeps it, a refresh extends it."""
    CacheEntry.objects.using(alias).create(
        key=stored,
        value=token,
        created_at=UtcNow() - timedelta(hours=25),
        expires_at=UtcNow() + timedelta(minutes=5),
    )


@pytest.mark.parametrize("lineup", LINEUPS.values(), ids=LINEUPS.keys())
@pytest.mark.parametrize("alias", ["postgres", "mariadb"])
def test_clear_stale_and_a_batch_refresh_of_the_same_rows_do_not_deadlock(
    alias: str, lineup: Lineup, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_service(alias)
    monkeypatch.setattr(retries, "BUSY_WAIT", 0.0)  # a deadlock is raised, not retried
    backend = DatabaseBackend(using=alias)
    names = (f"{key}-a", f"{key}-b")  # LOW < HIGH, byte for byte
    stored = [storage_key(name) for name in names]
    tokens = (new_token(), new_token())
    for row in lineup.written:
        _plant_abandoned(alias, stored[row], tokens[row])
    ttl, day = timedelta(minutes=1), timedelta(hours=24)
    items = [Refresh(names[row], tokens[row], ttl=ttl, max_lifetime=day) for row in lineup.sent]
    by_pages = None
    if lineup.sweep_reads_pages and connections[alias].vendor == "postgresql":
        by_pages = "SET enable_indexscan = off; SET enable_bitmapscan = off"
    rows = CacheEntry.objects.using(alias)
    try:
        with transaction.atomic(using=alias):
            rows.select_for_update().get(key=stored[lineup.held])
            sweep = _Worker(alias, backend.clear_stale, setup=by_pages)
            _waits(sweep)
            refresh = _Worker(alias, lambda: backend.refresh_many(items))
            _waits(refresh)
        # Let go: the sweep takes the held row, then the other one.
        swept, refreshed = sweep.result(), refresh.result()
        assert swept >= 2
        assert refreshed == [False, False]  # swept first: the refresh found both rows gone
        assert not rows.filter(key__in=stored).exists()
    finally:
        rows.filter(key__in=stored)._raw_delete(alias)
