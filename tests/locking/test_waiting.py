"""Waiting for a held key: the pauses, and what a waiter costs the database."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import HeldLock
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.exceptions import LockNotAcquired
from django_tasklock.leases.lease import new_token
from django_tasklock.locking.waiting import EXPIRY_JITTER, MAX_PAUSE, Backoff
from tests.conftest import require_service

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


def test_backoff_never_sleeps_past_the_lease_or_the_deadline() -> None:
    backoff = Backoff(timedelta(seconds=10))
    pauses = [backoff.next_pause(None) for _ in range(12)]
    assert all(p is not None and 0 < p <= MAX_PAUSE for p in pauses)
    short = backoff.next_pause(0.01)
    assert short is not None
    assert short <= 0.01 + EXPIRY_JITTER
    assert Backoff(timedelta(0)).next_pause(5.0) is None
    near = Backoff(timedelta(seconds=0.05))
    pause = near.next_pause(None)
    assert pause is not None
    assert pause <= 0.05


class PeekCounting(DatabaseBackend):
    peeks = 0

    def peek(self, key: str) -> HeldLock | None:
        self.peeks += 1
        return super().peek(key)


def _rollbacks_so_far() -> int:
    """Transactions rolled back in the test database, as PostgreSQL's statistics say."""
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.databases
def test_waiting_on_postgres_adds_no_failed_insert_per_poll() -> None:
    # A conflicting INSERT is an ERROR in PostgreSQL's log and a rolled-back
    # transaction; a waiter must read while the key is held, not insert.
    require_service("postgres")
    holder = DatabaseBackend(using="postgres")
    assert holder.acquire("waited-for", new_token(), ttl=LONG, max_lifetime=LIFE)
    connections["postgres"].close()  # a closing session flushes its statistics
    before = _rollbacks_so_far()
    waiter = PeekCounting(using="postgres")

    def wait_in_a_thread() -> None:
        try:
            with pytest.raises(LockNotAcquired):
                TaskLockService(waiter).lock("waited-for", wait=1.0).acquire()
        finally:
            waiter.close()  # ends the waiter's session, flushing its statistics

    thread = threading.Thread(target=wait_in_a_thread)
    thread.start()
    thread.join()
    threading.Event().wait(0.5)  # the server finishes the closed session
    rolled_back = _rollbacks_so_far() - before
    assert rolled_back <= 1  # the first try's INSERT only, however many polls
    assert waiter.peeks >= 3
