"""``django_tasklock.testing.delegate.DelegatingBackend``: the base of test wrappers.

A wrapper shares its inner backend's capabilities, so it must answer every
call those capabilities promise from the inner backend.
"""

from __future__ import annotations

from datetime import timedelta

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import BaseBackend
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.testing.delegate import DelegatingBackend

#: Left to BaseBackend on purpose: a waiter of a wrapper polls (the inner backend's
#: wake-ups would bypass the calls a wrapper changes).
_NOT_DELEGATED = {"watch"}


def test_every_call_of_a_backend_is_passed_to_the_inner_one() -> None:
    calls = {
        name
        for name, value in vars(BaseBackend).items()
        if callable(value) and not name.startswith("_")
    }
    assert calls - set(vars(DelegatingBackend)) == _NOT_DELEGATED


def test_a_rerun_through_a_wrapper_is_marked_and_run_once_more() -> None:
    """``capabilities.rerun`` is the inner backend's: so are the marks."""
    backend = DelegatingBackend(MemoryBackend())
    service = TaskLockService(backend)
    runs: list[bool] = []

    def work() -> None:
        if not runs:
            skipped = service.run_exclusive("wrapped-rerun", lambda: None, on_locked="rerun")
            assert skipped.rerun
        runs.append(True)

    result = service.run_exclusive("wrapped-rerun", work, on_locked="rerun")
    assert result.acquired
    assert len(runs) == 2
    assert backend.rerun_marks() == {}


def test_a_wrapper_reaps_through_the_inner_backend() -> None:
    from django_tasklock.leases.tokens import new_token
    from django_tasklock.testing.cases_dead import dead_token, proofs_here

    proofs_here()
    inner = MemoryBackend()
    hour = timedelta(hours=1)
    assert inner.acquire("dead-behind-wrapper", dead_token(), ttl=hour, max_lifetime=hour)
    assert inner.acquire("ours-behind-wrapper", new_token(), ttl=hour, max_lifetime=hour)
    ended = DelegatingBackend(inner).reap_dead_holders({"ours-behind-wrapper"})
    assert [held.key for held in ended] == ["dead-behind-wrapper"]
