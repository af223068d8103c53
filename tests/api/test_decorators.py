"""@exclusive on functions, coroutine functions and methods, on every backend."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from django_tasklock import LockNotAcquired, TaskLockService, exclusive
from django_tasklock.api.decorators import CONFLICT_MESSAGE
from django_tasklock.testing import ContractBackend

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run``, then close the connections of the thread the lock's storage calls used."""

    async def main() -> T:
        try:
            return await coroutine
        finally:
            await sync_to_async(connections.close_all, thread_sensitive=True)()

    return asyncio.run(main())


def nothing_stored(contract_backend: ContractBackend) -> bool:
    assert contract_backend.stored_keys is not None
    return contract_backend.stored_keys() == set()


@pytest.fixture
def service(any_backend: ContractBackend) -> TaskLockService:
    return TaskLockService(any_backend.backend)


def test_sync_function_runs_when_free_and_returns_none_while_held(
    service: TaskLockService, key: str
) -> None:
    calls: list[str] = []

    @exclusive("job:{n}", service=service)
    def job(n: str) -> str:
        calls.append(n)
        return n.upper()

    assert job(key) == key.upper()
    with service.lock(f"job:{key}", ttl=30):
        assert job(key) is None
    assert calls == [key]
    assert job(key) == key.upper()  # released


def test_async_function_gets_an_async_wrapper(service: TaskLockService, key: str) -> None:
    @exclusive("job:{n}", service=service)
    async def job(n: str) -> str:
        await asyncio.sleep(0)
        return f"done {n}"

    assert inspect.iscoroutinefunction(job)
    assert run(job(key)) == f"done {key}"

    async def while_held() -> str | None:
        async with service.lock(f"job:{key}", ttl=30):
            return await job(key)

    assert run(while_held()) is None


def test_on_locked_gets_the_call_arguments_and_its_value_is_returned(
    service: TaskLockService, key: str
) -> None:
    seen: list[tuple[Any, ...]] = []

    def busy(n: str, *, flag: bool = False) -> str:
        seen.append((n, flag))
        return "busy"

    @exclusive("job:{n}", service=service, on_locked=busy)
    def job(n: str, *, flag: bool = False) -> str:
        return "ran"

    with service.lock(f"job:{key}", ttl=30):
        assert job(key, flag=True) == "busy"
    assert seen == [(key, True)]


def test_async_on_locked_may_be_a_coroutine_function(service: TaskLockService, key: str) -> None:
    async def busy(n: str) -> str:
        return f"busy {n}"

    @exclusive("job:{n}", service=service, on_locked=busy)
    async def job(n: str) -> str:
        return "ran"

    async def while_held() -> str | None:
        async with service.lock(f"job:{key}", ttl=30):
            return await job(key)

    assert run(while_held()) == f"busy {key}"


class Rollups:
    @exclusive("rollups:{self.day}:{region}")
    def rebuild(self, region: str) -> str:
        return f"{self.day}/{region}"

    def __init__(self, day: str) -> None:
        self.day = day


@pytest.mark.databases
def test_methods_see_self_in_the_template(key: str) -> None:
    service = TaskLockService()
    assert Rollups(key).rebuild("eu") == f"{key}/eu"
    with service.lock(f"rollups:{key}:eu", ttl=30):
        assert Rollups(key).rebuild("eu") is None
        assert Rollups(key).rebuild("us") == f"{key}/us"


def bare_job() -> str:
    return "ran"


bare = exclusive(bare_job)


@pytest.mark.databases
def test_bare_decorator_keys_by_module_and_qualified_name() -> None:
    service = TaskLockService()
    assert bare() == "ran"
    with service.lock("tests.api.test_decorators.bare_job", ttl=30):
        assert bare() is None


def test_callable_key_is_given_as_key_keyword(service: TaskLockService, key: str) -> None:
    @exclusive(key=lambda n, **_: f"job:{n}", service=service)
    def job(n: str, **options: Any) -> str:
        return "ran"

    with service.lock(f"job:{key}", ttl=30):
        assert job(key, colour="red") is None
    assert job(key) == "ran"


def test_wrapper_keeps_name_docstring_signature_and_wrapped() -> None:
    def job(work: Any, day: str = "today") -> str:
        """Process one piece of work."""
        return "ran"

    for decorated in (exclusive(job), exclusive("job:{work.id}")(job)):
        assert decorated.__name__ == "job"
        assert decorated.__doc__ == "Process one piece of work."
        assert decorated.__wrapped__ is job  # type: ignore[attr-defined]
        assert inspect.signature(decorated) == inspect.signature(job)


def test_exceptions_propagate_and_release_the_key(service: TaskLockService, key: str) -> None:
    @exclusive("job:{n}", service=service)
    def job(n: str) -> None:
        raise LookupError("boom")

    with pytest.raises(LookupError, match="boom"):
        job(key)
    assert service.peek(f"job:{key}") is None


def test_lock_not_acquired_from_inside_the_function_is_not_taken_for_held(
    service: TaskLockService, key: str
) -> None:
    @exclusive("job:{n}", service=service)
    def job(n: str) -> None:
        raise LockNotAcquired("a lock the function itself wanted")

    with pytest.raises(LockNotAcquired, match="the function itself"):
        job(key)


def test_a_view_gets_409_conflict_also_as_a_method(service: TaskLockService, key: str) -> None:
    class Reports:
        @exclusive("report:{request.user.pk}", service=service)
        def build(self, request: HttpRequest) -> HttpResponse:
            return HttpResponse("built")

    request = RequestFactory().get("/")
    request.user = SimpleNamespace(pk=key)  # type: ignore[assignment]
    with service.lock(f"report:{key}", ttl=30):
        response = Reports().build(request)
    assert response.status_code == 409
    assert response["Content-Type"] == "text/plain"
    assert response.content.decode() == CONFLICT_MESSAGE
    assert Reports().build(request).content == b"built"


def test_bad_template_fails_at_decoration_naming_it() -> None:
    with pytest.raises(ValueError, match="'wrok'"):

        @exclusive("pr:{wrok.id}")
        def job(work: Any) -> None: ...


def test_template_failing_to_render_fails_at_the_call_and_writes_nothing(
    any_backend: ContractBackend,
) -> None:
    @exclusive("pr:{work.id}", service=TaskLockService(any_backend.backend))
    def job(work: Any) -> None: ...

    with pytest.raises(ValueError, match="has no attribute 'id'"):
        job(SimpleNamespace(pk=1))
    assert nothing_stored(any_backend)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: exclusive(lambda n: f"job:{n}"), TypeError, "key="),
        (lambda: exclusive(42), TypeError, "key must be"),  # type: ignore[call-overload]
        (lambda: exclusive("a", key="b"), TypeError, "twice"),  # type: ignore[call-overload]
        (lambda: exclusive(bare_job, key="b"), TypeError, "key only"),  # type: ignore[call-overload]
        (lambda: exclusive(on_locked=3), TypeError, "on_locked"),  # type: ignore[call-overload]
        (lambda: exclusive(key=3)(bare_job), TypeError, "key must be"),  # type: ignore[call-overload]
    ],
)
def test_bad_arguments_are_refused_at_decoration(call: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_bad_lock_options_are_refused_before_anything_is_written(
    any_backend: ContractBackend,
) -> None:
    @exclusive("job", ttl=-1, service=TaskLockService(any_backend.backend))
    def job() -> None: ...

    with pytest.raises(ValueError, match="ttl"):
        job()
    assert nothing_stored(any_backend)


def test_a_misspelt_option_lists_the_decorators_own_keywords() -> None:
    """The list was the lock's options: it offered cancel_on_loss (which the decorator
    refuses) and left out on_locked, on_lost and service."""
    from django_tasklock import exclusive

    with pytest.raises(TypeError, match="unexpected keyword argument 'tll'") as info:
        exclusive("x", tll=5)  # type: ignore[call-overload]
    message = str(info.value)
    assert message.startswith("unexpected keyword argument 'tll'; exclusive() takes ")
    accepted = message.rpartition(" takes ")[2].split(", ")
    assert "cancel_on_loss" not in accepted
    assert {"key", "on_locked", "on_lost", "service", "ttl", "wait"} <= set(accepted)
