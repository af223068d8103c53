"""Enqueues of one unique key racing each other, in this process, on every backend.

``claim()`` looks at the key, then takes it. A rival enqueue may take it in
between: the refusal must then name that rival's lease, as any other refusal
does, and if the rival's task has already ended, the key is free and taken.
The rivals here are real claims on the real backend, made at that moment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from django_tasklock.api.unique import claim, unclaim
from django_tasklock.backends.base import BaseBackend, HeldLock, lease_id
from django_tasklock.exceptions import AlreadyEnqueued
from django_tasklock.testing import ContractBackend

THREADS = 20


class Rival:
    """The backend, with the next of a method's hooks run right after each call of it.

    ``Rival(backend, peek=[f])`` runs ``f()`` after the first look at a key: a
    rival enqueue landing between ``claim()``'s look and its take.
    """

    def __init__(self, backend: BaseBackend, **after: list[Callable[[], object]]) -> None:
        self._backend, self._after = backend, after

    def __getattr__(self, name: str) -> Any:
        method, hooks = getattr(self._backend, name), self._after.get(name)
        if not hooks:
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            outcome = method(*args, **kwargs)
            hooks.pop(0)()
            return outcome

        return call


def test_a_rival_taking_the_key_between_the_look_and_the_take_is_named(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    rival: list[str] = []
    racing: Any = Rival(backend, peek=[lambda: rival.append(claim(key, ttl=60, backend=backend))])
    with pytest.raises(AlreadyEnqueued) as refused:
        claim(key, ttl=60, backend=racing)
    # Before: held None, as if nobody held the key, where the rival held it all along.
    assert refused.value.held is not None
    assert refused.value.held.lease == lease_id(rival[0])
    assert "held by " in str(refused.value)
    unclaim(key, rival[0], backend=backend)


def test_a_rival_whose_task_ended_before_the_next_look_leaves_the_key_to_take(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    rival: list[str] = []
    racing: Any = Rival(
        backend,
        peek=[lambda: rival.append(claim(key, ttl=60, backend=backend))],
        acquire=[lambda: unclaim(key, rival[0], backend=backend)],  # its task ended
    )
    # Before: refused (held None), with nobody holding the key any more.
    token = claim(key, ttl=60, backend=racing)
    held = backend.peek(key)
    assert held is not None
    assert held.lease == lease_id(token)
    unclaim(key, token, backend=backend)


def test_a_burst_of_claims_from_threads_takes_the_key_once_and_names_it_to_the_rest(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    start = threading.Barrier(THREADS)
    tokens: list[str] = []
    refusals: list[HeldLock | None] = []
    errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            backend.peek(key)  # this thread's connection is open before the burst
            start.wait()
            try:
                tokens.append(claim(key, ttl=60, backend=backend))
            except AlreadyEnqueued as exc:
                refusals.append(exc.held)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(tokens) == 1
    assert len(refusals) == THREADS - 1
    assert {held.lease if held else None for held in refusals} == {lease_id(tokens[0])}
    unclaim(key, tokens[0], backend=backend)
