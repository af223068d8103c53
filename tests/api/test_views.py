"""@exclusive on views served through Django's test client (``tests.urls``).

A view whose key is held answers 409 Conflict: function views, class-based
views (``method_decorator``) and async views, on every backend; and under
``ATOMIC_REQUESTS``, which runs every view inside a transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import django
import pytest
from django.conf import settings
from django.db import connections
from django.test import Client, override_settings

from django_tasklock import TaskLockService
from django_tasklock.api.decorators import CONFLICT_MESSAGE
from django_tasklock.exceptions import TaskLockError
from tests import views
from tests.conftest import require_service

pytestmark = pytest.mark.databases

#: The settings that put the locks on each backend.
LOCK_SETTINGS: dict[str, dict[str, Any]] = {
    "sqlite": {"TASKLOCK_BACKEND": "database", "TASKLOCK_DATABASE": "default"},
    "postgres": {"TASKLOCK_BACKEND": "database", "TASKLOCK_DATABASE": "postgres"},
    "redis": {"TASKLOCK_BACKEND": "redis", "TASKLOCK_REDIS_URL": settings.REDIS_URL},
    "memory": {"TASKLOCK_BACKEND": "memory"},
    # MySQL/MariaDB, when the suite has such a database.
    **{
        alias: {"TASKLOCK_BACKEND": "database", "TASKLOCK_DATABASE": alias}
        for alias, database in settings.DATABASES.items()
        if database["ENGINE"].endswith("mysql")
    },
}
#: The backends on which views must work under ATOMIC_REQUESTS.
ATOMIC_REQUESTS_BACKENDS = [name for name in LOCK_SETTINGS if name != "sqlite"]


def use_backend(name: str) -> Any:
    if name in ("postgres", "redis"):
        require_service(name)
    return override_settings(**LOCK_SETTINGS[name])


@pytest.fixture(params=list(LOCK_SETTINGS))
def backend_name(request: pytest.FixtureRequest) -> Iterator[str]:
    with use_backend(request.param):
        yield request.param


@pytest.mark.parametrize("route", ["report", "class", "async", "async-class"])
@pytest.mark.usefixtures("backend_name")
def test_view_answers_409_while_its_key_is_held(route: str, key: str) -> None:
    if route == "async-class" and django.VERSION < (5, 0):
        pytest.skip("method_decorator keeps async methods async from Django 5.0 on")
    client = Client()
    assert client.get(f"/{route}/{key}/").status_code == 200
    with TaskLockService().lock(f"view:{key}", ttl=30):
        response = client.get(f"/{route}/{key}/")
    assert response.status_code == 409
    assert response["Content-Type"] == "text/plain"
    assert response.content.decode() == CONFLICT_MESSAGE
    # When to come back: the seconds the holder's lease had left, rounded up.
    assert 1 <= int(response["Retry-After"]) <= 30
    assert client.get(f"/{route}/{key}/").status_code == 200


@pytest.fixture(params=ATOMIC_REQUESTS_BACKENDS)
def atomic_requests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """ATOMIC_REQUESTS on for every database (Django reads it at each request)."""
    for alias in settings.DATABASES:
        monkeypatch.setitem(connections[alias].settings_dict, "ATOMIC_REQUESTS", True)
    with use_backend(request.param):
        yield


@pytest.mark.usefixtures("atomic_requests")
def test_under_atomic_requests_one_request_runs_and_an_overlapping_one_gets_409(
    key: str,
) -> None:
    views.entered.clear()
    views.release.clear()
    responses: list[Any] = []

    def request_in_a_thread() -> None:
        try:
            responses.append(Client().get(f"/slow/{key}/"))
        finally:
            connections.close_all()  # the test client leaves them open

    first = threading.Thread(target=request_in_a_thread)
    first.start()
    try:
        assert views.entered.wait(timeout=30)
        assert Client().get(f"/slow/{key}/").status_code == 409
    finally:
        views.release.set()
        first.join(timeout=30)
    assert [r.status_code for r in responses] == [200]
    assert Client().get(f"/report/{key}/").status_code == 200  # released


@pytest.fixture
def sqlite_atomic_requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    with use_backend("sqlite"):
        yield


@pytest.mark.usefixtures("sqlite_atomic_requests")
def test_sqlite_under_atomic_requests_fails_naming_the_setting_and_the_cure(key: str) -> None:
    with pytest.raises(TaskLockError) as info:
        Client().get(f"/report/{key}/")
    assert "ATOMIC_REQUESTS" in str(info.value)
    assert "@transaction.non_atomic_requests" in str(info.value)


@pytest.mark.usefixtures("sqlite_atomic_requests")
def test_sqlite_under_atomic_requests_works_for_a_non_atomic_view(key: str) -> None:
    client = Client()
    assert client.get(f"/non-atomic/{key}/").content == f"non-atomic {key}".encode()
    with TaskLockService().lock(f"view:{key}", ttl=30):
        assert client.get(f"/non-atomic/{key}/").status_code == 409


def test_retry_after_is_at_least_a_second() -> None:
    from datetime import datetime, timezone

    from django_tasklock.api.decorators import conflict
    from django_tasklock.holders import HeldLock, Holder

    now = datetime.now(timezone.utc)
    nearly_over = HeldLock("k", Holder("h", 1), now, now, seconds_left=0.2)
    assert conflict(nearly_over)["Retry-After"] == "1"
    assert (
        conflict(HeldLock("k", Holder("h", 1), now, now, seconds_left=12.1))["Retry-After"] == "13"
    )
    assert conflict(None)["Retry-After"] == "1"  # the holder let go since
