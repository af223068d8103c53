"""``@exclusive(..., limit=N)``: N calls per rendered key at once, the next skipped.

A view answers 409 Conflict once all N permits of its key are held; a plain
function (a task's body) returns None. Key templates render as for a mutex.
On every backend that gives permits.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from django_tasklock import exclusive, lock
from django_tasklock.api.decorators import CONFLICT_MESSAGE
from tests.api.test_views import use_backend

pytestmark = pytest.mark.databases

#: Every backend gives permits.
PERMIT_BACKENDS = ["memory", "sqlite", "postgres", "mariadb", "redis"]


@pytest.fixture(params=PERMIT_BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> Iterator[str]:
    from tests.api.test_views import LOCK_SETTINGS

    if request.param not in LOCK_SETTINGS:
        pytest.skip(f"no {request.param} database in this run")
    with use_backend(request.param):
        yield request.param
    connections.close_all()


@pytest.mark.usefixtures("backend_name")
def test_a_view_answers_409_when_all_its_permits_are_held(key: str) -> None:
    ran: list[int] = []

    @exclusive(key + ":{tenant_id}", limit=2)
    def export(request: HttpRequest, tenant_id: int) -> HttpResponse:
        ran.append(tenant_id)
        return HttpResponse("done")

    request = RequestFactory().get("/export")
    first, second = lock(f"{key}:7", limit=2), lock(f"{key}:7", limit=2)
    with first:
        assert export(request, tenant_id=7).status_code == 200  # one of two held: runs
        with second:
            refused = export(request, tenant_id=7)
            assert refused.status_code == 409
            assert refused.content.decode() == CONFLICT_MESSAGE
            assert refused["Retry-After"] == "1"
            assert export(request, tenant_id=8).status_code == 200  # another tenant's key
        assert export(request, tenant_id=7).status_code == 200
    assert ran == [7, 8, 7]


@pytest.mark.usefixtures("backend_name")
def test_a_function_under_a_limit_returns_none_when_all_permits_are_held(key: str) -> None:
    permits: list[int | None] = []

    @exclusive(key + ":{n}", limit=3)
    def work(n: int) -> str:
        from django_tasklock import current_lock

        held = current_lock()
        assert held is not None
        permits.append(held.permit)
        return "ran"

    held = [lock(f"{key}:1", limit=3) for _ in range(3)]
    for one in held[:2]:
        one.acquire()
    try:
        assert work(1) == "ran"
        held[2].acquire()
        assert work(1) is None
    finally:
        for one in held:
            if one.held:
                one.release()
    assert permits == [2]
