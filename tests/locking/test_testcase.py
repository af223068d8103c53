"""Locks under a Django TestCase transaction (pytest-django's plain ``db``).

Users' own tests run this way: the lease lives in the test's transaction, is
rolled back with it, and must not be reported lost because the heartbeat's
thread cannot see it.
"""

from __future__ import annotations

import logging
import time

import pytest
from django.db import connections

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.database import DatabaseBackend
from tests.conftest import DATABASE_ALIASES

pytestmark = pytest.mark.django_db(databases=DATABASE_ALIASES)


@pytest.mark.parametrize("alias", DATABASE_ALIASES)
def test_work_longer_than_a_refresh_is_not_lost_in_a_test_transaction(
    alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = DatabaseBackend(using=alias)
    service = TaskLockService(backend)

    def work() -> bool:
        assert connections[alias].in_atomic_block  # the test's transaction
        assert not service.run_exclusive("in-test", lambda: None).acquired
        time.sleep(0.5)  # a few heartbeats
        return backend.peek("in-test") is not None

    with caplog.at_level(logging.WARNING, logger="django_tasklock"):
        result = service.run_exclusive("in-test", work, ttl=2, refresh_interval=0.1)
    assert result.acquired
    assert result.result is True
    assert not result.lost
    assert caplog.text == ""
    assert backend.peek("in-test") is None


def test_lease_is_released_at_once_in_the_test_transaction() -> None:
    # The TestCase transaction never commits: waiting for it would hold the key for ever.
    from django_tasklock.backends.memory import MemoryBackend

    service = TaskLockService(MemoryBackend())
    assert connections["default"].in_atomic_block
    assert service.run_exclusive("in-test", lambda: None).acquired
    assert service.peek("in-test") is None
