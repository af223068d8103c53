"""What the contract cases share: the backend description, timing, small helpers."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from django_tasklock.backends.base import BaseProvider
from django_tasklock.signals import lock_acquired, lock_released
from django_tasklock.testing.workers import ProviderRecipe

SLACK = 0.35
LONG = timedelta(seconds=30)
LIFE = timedelta(hours=1)


@dataclasses.dataclass
class ContractBackend:
    """What the contract needs to know about one provider under test.

    ``recipe``: how another process builds the same provider (needed when the
    provider claims ``cross_process``). ``plant(stored_key, value, created_ago,
    expires_in)``: write a raw lease, bypassing the provider. ``put_foreign(
    stored_key)``: write an entry that is not a lock (an expired one, where the
    storage has expiry). ``stored_keys()``: every key in the storage that the
    test may see. ``unreachable()``: a provider pointed at storage that does
    not answer.
    """

    name: str
    provider: BaseProvider
    recipe: ProviderRecipe | None = None
    plant: Callable[[str, str, timedelta, timedelta], None] | None = None
    put_foreign: Callable[[str], None] | None = None
    stored_keys: Callable[[], set[str]] | None = None
    unreachable: Callable[[], BaseProvider] | None = None


def require(backend: ContractBackend, hook: str) -> Any:
    value = getattr(backend, hook)
    if value is None:
        pytest.skip(f"{backend.name}: the contract backend gives no {hook!r} hook")
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


def cross_process_recipe(backend: ContractBackend) -> ProviderRecipe:
    """The recipe for another process, or a skip naming the capability that is missing."""
    if not backend.provider.capabilities.cross_process:
        pytest.skip(f"{backend.name}: capability cross_process=False (one process only)")
    recipe = require(backend, "recipe")
    assert isinstance(recipe, ProviderRecipe)
    return recipe
