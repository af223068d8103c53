"""What the contract cases share: the backend description, timing, small helpers."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import pytest

from django_tasklock.backends.base import BaseBackend
from django_tasklock.signals import lock_acquired, lock_released
from django_tasklock.testing.workers import BackendRecipe

SLACK = 0.35
LONG = timedelta(seconds=30)
LIFE = timedelta(hours=1)


@dataclasses.dataclass
class ContractBackend:
    """What the contract needs to know about one backend under test.

    ``recipe``: how another process builds the same backend (needed when the
    backend claims ``cross_process``). ``plant(stored_key, value, created_ago,
    expires_in)``: write a raw lease, bypassing the backend. ``put_foreign(
    stored_key)``: write an entry that is not a lock (an expired one, where the
    storage has expiry). ``stored_keys()``: every key in the storage that the
    test may see. ``unreachable()``: a backend pointed at storage that does
    not answer. ``skew_worker_clock(offset)``: a context manager giving a
    backend on the same storage as used by a worker whose clock is ``offset``
    off (for a backend built from a recipe, :func:`faketime_worker_clock`
    gives one); without it a backend claiming ``server_clock`` is not checked.
    """

    name: str
    backend: BaseBackend
    recipe: BackendRecipe | None = None
    plant: Callable[[str, str, timedelta, timedelta], None] | None = None
    put_foreign: Callable[[str], None] | None = None
    stored_keys: Callable[[], set[str]] | None = None
    unreachable: Callable[[], BaseBackend] | None = None
    skew_worker_clock: Callable[[timedelta], AbstractContextManager[BaseBackend]] | None = None


def require(subject: ContractBackend, hook: str) -> Any:
    value = getattr(subject, hook)
    if value is None:
        pytest.skip(f"{subject.name}: the contract backend gives no {hook!r} hook")
    return value


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.02) -> float:
    """Poll until ``predicate()``; return the monotonic time it first held."""
    end = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        if predicate():
            return now
        if now > end:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


class SignalRecorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, signal: Any, sender: Any, **kwargs: Any) -> None:
        name = {id(lock_acquired): "acquired", id(lock_released): "released"}.get(
            id(signal), "lost"
        )
        self.sent.append((name, kwargs))


def cross_process_recipe(subject: ContractBackend) -> BackendRecipe:
    """The recipe for another process, or a skip naming the capability that is missing."""
    if not subject.backend.capabilities.cross_process:
        pytest.skip(f"{subject.name}: capability cross_process=False (one process only)")
    recipe = require(subject, "recipe")
    assert isinstance(recipe, BackendRecipe)
    return recipe
