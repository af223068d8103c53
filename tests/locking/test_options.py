"""Validation of options and TASKLOCK_DEFAULTS: the same rules at check time and at run time."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.checks import check_tasklock_settings
from django_tasklock.locking.options import LockOptions, to_timedelta, validate_key
from tests.conftest import runs_manage_py_check


@pytest.mark.parametrize(
    "value",
    [1e-7, 0.0009, timedelta(microseconds=999), 1e14, 10**400, timedelta.max, float("inf")],
)
@pytest.mark.parametrize("name", ["ttl", "refresh_interval", "max_lifetime"])
def test_durations_out_of_range_are_value_errors_naming_the_parameter(
    name: str, value: object
) -> None:
    with pytest.raises(ValueError, match=name):
        to_timedelta(name, value)


def test_bounds_are_inclusive() -> None:
    assert to_timedelta("ttl", 0.001) == timedelta(milliseconds=1)
    assert to_timedelta("ttl", 86400) == timedelta(hours=24)
    assert to_timedelta("ttl", timedelta(hours=24)) == timedelta(hours=24)


def test_a_huge_number_is_shown_short() -> None:
    with pytest.raises(ValueError, match="ttl") as info:
        to_timedelta("ttl", 10**400)
    assert len(str(info.value)) < 120


def test_sub_millisecond_ttl_does_not_become_the_default() -> None:
    # A zero timedelta is falsy: 1e-7 once became the 15 minute default.
    with pytest.raises(ValueError, match="ttl"):
        LockOptions.resolve(ttl=1e-7)
    with pytest.raises(ValueError, match="max_lifetime"):
        LockOptions.resolve(max_lifetime=1e-7)


@pytest.mark.parametrize("key", ["a\x00b", "\x00", "lone \ud800", "\udfff"])
def test_keys_no_storage_can_hold_are_value_errors(key: str) -> None:
    with pytest.raises(ValueError, match="key"):
        validate_key(key)


@pytest.mark.parametrize("key", ["a\x1f0", "\x1f", "report\x1f2"])
def test_keys_that_would_name_a_limited_keys_permit_are_value_errors(key: str) -> None:
    with pytest.raises(ValueError, match="key must not contain the unit separator"):
        validate_key(key)


def test_any_other_unicode_key_is_fine() -> None:
    assert validate_key("clé:日本:🔒") == "clé:日本:🔒"


async def _work() -> None:  # pragma: no cover - never awaited
    pass


class _AsyncCallable:
    async def __call__(self) -> None:  # pragma: no cover - never awaited
        pass


@pytest.mark.parametrize(
    "fn", [_work, functools.partial(_work), _AsyncCallable(), functools.partial(_AsyncCallable())]
)
def test_coroutine_function_in_the_sync_api_names_the_async_twin(fn: Any) -> None:
    backend = MemoryBackend()
    with pytest.raises(TypeError, match="arun_exclusive"):
        TaskLockService(backend).run_exclusive("k", fn)
    with pytest.raises(TypeError, match=r"on_locked.*arun_exclusive"):
        TaskLockService(backend).run_exclusive("k", lambda: None, on_locked=fn)
    assert backend.list() == []


async def _returned() -> str:
    return "never run under the lock"


def _assert_closed_without_warning(run: Any, match: str = "arun_exclusive") -> None:
    """``run()`` raises a TypeError naming the async twin; the coroutine is closed quietly."""
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match=match) as info:
            run()
        del info
        gc.collect()
    assert [str(w.message) for w in caught] == []


def test_a_plain_function_returning_a_coroutine_is_refused_and_the_lock_released() -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    held: list[object] = []

    def returns_a_coroutine() -> Any:
        held.append(backend.peek("k"))
        return _returned()

    _assert_closed_without_warning(lambda: service.run_exclusive("k", returns_a_coroutine))
    _assert_closed_without_warning(lambda: service.run_exclusive("k", lambda: _returned()))
    assert held[0] is not None  # it ran under the lock...
    assert backend.list() == []  # ...which is released


def test_an_on_locked_returning_a_coroutine_is_refused_in_the_sync_api() -> None:
    from django_tasklock.leases.lease import new_token

    backend = MemoryBackend()
    assert backend.acquire("k", new_token(), ttl=timedelta(seconds=30), max_lifetime=timedelta(1))
    service = TaskLockService(backend)
    _assert_closed_without_warning(
        lambda: service.run_exclusive("k", lambda: None, on_locked=lambda: _returned())
    )


def test_a_decorated_plain_function_returning_a_coroutine_is_refused() -> None:
    from django_tasklock import exclusive

    backend = MemoryBackend()

    @exclusive("k", service=TaskLockService(backend))
    def job() -> Any:
        return _returned()

    _assert_closed_without_warning(job, match=r"job returned a coroutine.*async def")
    assert backend.list() == []


@pytest.mark.parametrize(
    ("options", "defaults"),
    [
        ({"ttl": 120, "max_lifetime": 60}, {}),
        ({"ttl": timedelta(minutes=2), "max_lifetime": timedelta(minutes=1)}, {}),
        ({"ttl": 120}, {"max_lifetime": 60}),
    ],
)
def test_a_ttl_longer_than_max_lifetime_is_a_value_error_naming_both(
    options: dict[str, Any], defaults: dict[str, Any]
) -> None:
    backend = MemoryBackend()
    ran: list[int] = []
    with override_settings(TASKLOCK_DEFAULTS=defaults):
        with pytest.raises(ValueError, match=r"ttl .*max_lifetime") as info:
            TaskLockService(backend).run_exclusive("k", lambda: ran.append(1), **options)
        with pytest.raises(ValueError, match=r"ttl .*max_lifetime"):
            TaskLockService(backend).lock("k", **options)
    if defaults:
        assert "TASKLOCK_DEFAULTS" in str(info.value)
    assert ran == []
    assert backend.list() == []


def test_a_ttl_a_call_did_not_choose_gives_way_to_a_shorter_max_lifetime() -> None:
    # The built-in ttl (15 minutes), or the project's: as today, the lease is
    # capped at max_lifetime; only a ttl and a max_lifetime both chosen conflict.
    assert LockOptions.resolve(max_lifetime=60).max_lifetime == timedelta(seconds=60)
    with override_settings(TASKLOCK_DEFAULTS={"ttl": 120}):
        assert LockOptions.resolve(max_lifetime=60).ttl == timedelta(seconds=120)
    with override_settings(TASKLOCK_DEFAULTS={"max_lifetime": 60}):
        assert check_tasklock_settings() == []


BAD_DEFAULTS: list[Any] = [
    {"ttl": -1},
    {"ttl": 1e-7},
    {"ttl": 1e14},
    {"ttl": 10**400},
    {"ttl": timedelta.max},
    {"ttl": "60"},
    {"ttl": 10, "refresh_interval": 20},
    {"ttl": 30, "refresh_interval": 60},
    {"refresh_interval": timedelta(minutes=15)},  # not shorter than the built-in ttl
    {"max_lifetime": 10**6},
    {"max_lifetime": 1e-7},
    {"ttl": 120, "max_lifetime": 60},
    {"tll": 5},
    {5: 5, "ttl": 60},
    ["ttl"],
]


@pytest.mark.parametrize("defaults", BAD_DEFAULTS)
def test_invalid_defaults_are_e007_at_check_time(defaults: Any) -> None:
    with override_settings(TASKLOCK_DEFAULTS=defaults):
        messages = check_tasklock_settings()
    assert [message.id for message in messages] == ["django_tasklock.E007"]
    assert "TASKLOCK_DEFAULTS" in messages[0].msg


@pytest.mark.parametrize("defaults", BAD_DEFAULTS)
def test_invalid_defaults_are_improperly_configured_at_run_time(defaults: Any) -> None:
    backend = MemoryBackend()
    with (
        override_settings(TASKLOCK_DEFAULTS=defaults),
        pytest.raises(ImproperlyConfigured, match="TASKLOCK_DEFAULTS"),
    ):
        # Even when this call passes every option itself.
        TaskLockService(backend).run_exclusive(
            "k", lambda: None, ttl=60, refresh_interval=10, max_lifetime=120
        )
    assert backend.list() == []


@runs_manage_py_check
def test_huge_default_fails_manage_py_check_cleanly() -> None:
    with (
        override_settings(TASKLOCK_DEFAULTS={"ttl": 1e14}),
        pytest.raises(SystemCheckError) as info,
    ):
        call_command("check")
    assert "django_tasklock.E007" in str(info.value)


def test_a_project_interval_gives_way_to_a_shorter_call_ttl() -> None:
    # The defaults are valid together; a call with its own, shorter ttl gets
    # a third of it, at check time and at run time alike.
    with override_settings(TASKLOCK_DEFAULTS={"ttl": 120, "refresh_interval": 30}):
        assert check_tasklock_settings() == []
        assert LockOptions.resolve().refresh_interval == timedelta(seconds=30)
        assert LockOptions.resolve(ttl=60).refresh_interval == timedelta(seconds=30)
        assert LockOptions.resolve(ttl=9).refresh_interval == timedelta(seconds=3)
        with pytest.raises(ValueError, match="refresh_interval"):
            LockOptions.resolve(ttl=9, refresh_interval=9)
