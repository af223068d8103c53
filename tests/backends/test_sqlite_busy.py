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
from django.db.backends.base.base import BaseDatabaseWrapper

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.connections import add_thread_connection
from django_tasklock.leases.lease import new_token

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


#: A shared-cache in-memory database, as Django's test runner makes of ``NAME: ":memory:"``
#: for threads (``file:memorydb_default?mode=memory&cache=shared``, ``OPTIONS["uri"]``).
SHARED_MEMORY = "file:tasklock_shared?mode=memory&cache=shared"
POLLERS = 8
ROUNDS = 5


def shared_memory_alias() -> str:
    """This thread's own connection to the shared-cache in-memory database."""
    settings_dict = dict(connections["default"].settings_dict)
    settings_dict["NAME"] = SHARED_MEMORY
    settings_dict["OPTIONS"] = {**settings_dict.get("OPTIONS", {}), "uri": True}
    add_thread_connection("tasklock_shared", settings_dict)
    return "tasklock_shared"


def close_memory_connection(alias: str) -> None:
    """Close this thread's connection to an in-memory database for real.

    Django's SQLite ``close()`` ignores an in-memory database (closing it would
    drop the data), so each thread's connection would otherwise wait for the
    garbage collector: an "unclosed database" ``ResourceWarning`` on Python 3.13.
    """
    BaseDatabaseWrapper.close(connections[alias])


@pytest.fixture
def shared_memory() -> Iterator[str]:
    """The lock's tables in a shared-cache in-memory database, kept alive by this connection."""
    from django_tasklock.models import CacheEntry, FenceCounter

    alias = shared_memory_alias()
    with connections[alias].schema_editor() as editor:
        editor.create_model(CacheEntry)
        editor.create_model(FenceCounter)
    try:
        yield alias
    finally:
        close_memory_connection(alias)  # the last connection: the database goes with it
        del connections[alias]


def test_shared_cache_memory_releases_and_acquisitions_under_contention(
    key: str, shared_memory: str, caplog: pytest.LogCaptureFixture
) -> None:
    """1 holder, 8 pollers with ``wait=`` on one key: "database table is locked" is waited out."""
    caplog.set_level("WARNING", logger="django_tasklock")
    errors: list[BaseException] = []

    def in_thread(body: Any, done: threading.Barrier) -> Any:
        def run() -> None:
            try:
                body(TaskLockService(DatabaseBackend(using=shared_memory_alias())))
            except BaseException as exc:
                errors.append(exc)
            finally:
                # Closed once every thread of the round is done: on Python 3.10 sqlite3's close
                # keeps the GIL while it waits for the shared cache's mutex, which a statement
                # of another thread holds while it waits for the GIL (to call one of Django's
                # SQL functions): the whole process hangs (CPython issue 86864, fixed in 3.11).
                with contextlib.suppress(threading.BrokenBarrierError):
                    done.wait(timeout=150)
                close_memory_connection("tasklock_shared")

        # A daemon: one stuck for good fails the test below, not the worker's exit.
        return threading.Thread(target=run, daemon=True)

    def one_round() -> None:
        acquired = threading.Event()
        ran: list[bool] = []

        def holder(service: TaskLockService) -> None:
            def hold() -> None:
                acquired.set()
                time.sleep(0.2)  # the pollers find the key held

            assert service.run_exclusive(key, hold, ttl=LONG).acquired

        def poller(service: TaskLockService) -> None:
            result = service.run_exclusive(key, lambda: ran.append(True), wait=60, ttl=LONG)
            assert result.acquired

        done = threading.Barrier(1 + POLLERS)
        first = in_thread(holder, done)
        first.start()
        assert acquired.wait(30)
        pollers = [in_thread(poller, done) for _ in range(POLLERS)]
        for thread in pollers:
            thread.start()
        deadline = time.monotonic() + 120
        for thread in [first, *pollers]:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        assert not [t for t in [first, *pollers] if t.is_alive()], "a thread is stuck"
        assert not errors, repr(errors)
        assert len(ran) == POLLERS
        assert DatabaseBackend(using=shared_memory).peek(key) is None

    for _ in range(ROUNDS):
        one_round()
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")], caplog.text
