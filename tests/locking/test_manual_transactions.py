"""``AUTOCOMMIT: False``: the release when the work ends, with or without a transaction open.

The lease lives on the same database as the work, the caller's connection
in manual transaction management (autocommit off outside ``atomic()``).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.connections import add_thread_connection
from django_tasklock.testing.support import wait_until
from tests.conftest import DATABASE_ALIASES, require_service

pytestmark = pytest.mark.databases


@pytest.fixture(params=["default", "postgres", "mariadb"], ids=["sqlite", "postgres", "mariadb"])
def manual(request: pytest.FixtureRequest) -> Iterator[str]:
    """A test database's alias, its connection opened with ``AUTOCOMMIT: False``.

    An alias of ``DATABASES``: the lock looks at the connections Django
    knows, not at thread-only ones.
    """
    alias = str(request.param)
    if alias not in DATABASE_ALIASES:
        require_service(alias)
    connection = connections[alias]
    connection.close()
    connection.settings_dict["AUTOCOMMIT"] = False
    try:
        yield alias
    finally:
        if connection.connection is not None:
            connection.rollback()
        connection.close()
        connection.settings_dict["AUTOCOMMIT"] = True


@pytest.fixture
def other(manual: str) -> Iterator[DatabaseBackend]:
    """Another worker's view of ``manual``'s database, on a connection in autocommit."""
    alias = f"{manual}_{uuid.uuid4().hex[:8]}"
    add_thread_connection(alias, {**connections[manual].settings_dict, "AUTOCOMMIT": True})
    try:
        yield DatabaseBackend(using=alias)
    finally:
        connections[alias].close()
        del connections[alias]


def _work(alias: str, *, commit: bool) -> str:
    if commit:
        ContentType.objects.using(alias).count()  # a transaction begins (sqlite3: none yet)
        connections[alias].commit()  # as code under AUTOCOMMIT: False does
    else:
        # A write: a transaction is open on every driver; rolled back by the fixture.
        ContentType.objects.using(alias).create(app_label="tasklock", model=uuid.uuid4().hex)
    return "done"


def test_released_when_the_work_ends_after_its_commit(
    manual: str, other: DatabaseBackend, key: str
) -> None:
    service = TaskLockService(DatabaseBackend(using=manual))
    try:
        result = service.run_exclusive(key, lambda: _work(manual, commit=True), ttl=60)
        assert result.acquired
        assert result.result == "done"
        if connections[manual].vendor == "mysql":
            # mysqlclient does not tell whether a transaction is open: the
            # lease is left to expire, as when one is.
            assert other.peek(key) is not None
        else:
            assert other.peek(key) is None, "the lease outlived the work and its commit"
    finally:
        other.force_release(key)


def test_left_to_expire_while_the_work_leaves_a_transaction_open(
    manual: str, other: DatabaseBackend, key: str
) -> None:
    service = TaskLockService(DatabaseBackend(using=manual))
    try:
        result = service.run_exclusive(key, lambda: _work(manual, commit=False), ttl=60)
        assert result.acquired
        assert other.peek(key) is not None  # the commit is the caller's, still to come
    finally:
        connections[manual].rollback()
        other.force_release(key)


def test_no_log_handler_runs_on_the_heartbeat_thread(
    manual: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With autocommit off the heartbeat refreshes through a side connection,
    opened and closed each tick: a failure to close it is logged (DEBUG),
    handled on the notifier thread, never on the heartbeat's."""
    wrapper_class = type(connections[manual])
    close = wrapper_class.close

    def close_then_fail(self: BaseDatabaseWrapper) -> None:
        close(self)  # closed all the same: the fault is in the farewell's reply
        # Only the side connection's close (not Django's own temporary ones).
        if (
            threading.current_thread().name == "django-tasklock-heartbeat"
            and sys._getframe(1).f_code.co_name == "alias_for_writing"
        ):
            raise OperationalError("the server did not answer the farewell")

    monkeypatch.setattr(wrapper_class, "close", close_then_fail)
    handled_on: list[str] = []

    class Recording(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "side connection" in record.getMessage():
                handled_on.append(threading.current_thread().name)

    handler = Recording(logging.DEBUG)
    logger = logging.getLogger("django_tasklock")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        service = TaskLockService(DatabaseBackend(using=manual))
        result = service.run_exclusive(key, lambda: time.sleep(1.0), ttl=10, refresh_interval=0.1)
        assert result.acquired
        wait_until(lambda: bool(handled_on), timeout=10)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert "django-tasklock-heartbeat" not in handled_on
