"""A SQLite file kept busy by another connection: the lock's reads wait it out too.

SQLite fails a statement with "database is locked" once the file has been
busy for the connection's ``timeout``. The lock's writes retry that for up to
``BUSY_WAIT``; so must its reads (``peek``, ``list``) and with them a waiter's
looks at a held key, or ``wait=`` would raise an error that a call without
``wait`` in the same moment never sees.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.connections import add_thread_connection
from django_tasklock.lease import new_token
from django_tasklock.service import TaskLockService

pytestmark = pytest.mark.databases

#: The SQLite ``timeout`` of the tests' connection: a busy statement fails after this.
QUICK = 0.2
#: How long the other connection keeps the file busy: many times ``QUICK``.
BUSY = 1.5
LONG = timedelta(seconds=60)


def quick_alias() -> str:
    """This thread's connection to the test SQLite file, failing busy statements fast."""
    settings_dict = dict(connections["default"].settings_dict)
    settings_dict["OPTIONS"] = {**settings_dict.get("OPTIONS", {}), "timeout": QUICK}
    add_thread_connection("default_quick", settings_dict)
    return "default_quick"


@contextlib.contextmanager
def file_busy(seconds: float) -> Iterator[None]:
    """Another connection holds an exclusive write transaction on the file for ``seconds``."""
    other = sqlite3.connect(
        connections["default"].settings_dict["NAME"], isolation_level=None, check_same_thread=False
    )
    other.execute("BEGIN EXCLUSIVE")
    ends = threading.Timer(seconds, other.rollback)
    ends.start()
    try:
        yield
    finally:
        ends.join()
        other.close()


@pytest.fixture
def held(key: str) -> Iterator[tuple[DatabaseBackend, str]]:
    """``key`` held by another holder, released at the end."""
    backend = DatabaseBackend(using="default")
    token = new_token()
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LONG)
    yield backend, token
    backend.release(key, token)


def test_peek_and_list_wait_until_the_file_is_free(
    key: str, held: tuple[DatabaseBackend, str]
) -> None:
    backend = DatabaseBackend(using=quick_alias())
    try:
        with file_busy(BUSY):
            seen = backend.peek(key)
        with file_busy(BUSY):
            listed = backend.list()
    finally:
        connections["default_quick"].close()
    assert seen is not None
    assert seen.key == key
    assert key in [lock.key for lock in listed]


def test_a_waiter_keeps_looking_while_the_file_is_busy(
    key: str, held: tuple[DatabaseBackend, str]
) -> None:
    outcome: dict[str, Any] = {}

    def waiter() -> None:
        service = TaskLockService(DatabaseBackend(using=quick_alias()))
        try:
            outcome["result"] = service.run_exclusive(key, lambda: "ran", wait=30)
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            connections["default_quick"].close()

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)  # the waiter found the key held and is looking again now and then
    with file_busy(BUSY):
        pass
    holder, token = held
    holder.release(key, token)
    thread.join(timeout=30)
    assert "error" not in outcome, repr(outcome.get("error"))
    result = outcome["result"]
    assert result.acquired
    assert result.result == "ran"
