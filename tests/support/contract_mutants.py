"""The contract suite against the backends of ``tests/support/mutants.py``, one class each.

Not collected by a plain ``pytest`` run (its name does not start with
``test_``): ``test_contract_mutants.py`` runs the cases listed in ``CASES``
in a child pytest and expects every mutant to fail at least one of them, the
correct backends (``Control*``) none, and a backend without the hooks a case
needs to be skipped with a reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings

from django_tasklock.backends.base import caller_key, storage_key
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.memory import MemoryBackend, _Lease
from django_tasklock.testing import (
    BackendContract,
    BackendRecipe,
    ContractBackend,
    faketime_worker_clock,
)
from tests.conftest import database_backend
from tests.support import mutants

CLEAR = "test_clear_stale_deletes_expired_and_abandoned_leases_only"
RESURRECT = "test_refresh_never_resurrects_an_expired_lease"
CAP = "test_storage_caps_refresh_at_max_lifetime"
FIRST = "test_first_lease_lasts_at_most_max_lifetime"
TOKEN = "test_refresh_and_release_are_bound_to_the_token"
EXCLUDE = "test_second_acquire_of_a_held_key_is_refused"
EXPIRED = "test_expired_lease_is_taken_over"
ABANDONED = "test_lease_older_than_24_hours_is_taken_over"
LISTING = "test_peek_and_list_show_live_leases_only"
CLOCK = "test_expiry_is_judged_by_the_storage_clock_not_the_workers"
NAMESPACE = "test_entries_outside_the_namespace_are_never_touched"
DEAD = "test_a_dead_holders_lease_is_taken_over_bound_to_its_token"
NEVER = "test_holders_whose_death_cannot_be_proven_are_never_taken_over"
MIN_HOLD_DEAD = "test_a_min_hold_outlives_its_dead_holder"
REAP = "test_reaping_ends_a_dead_holders_lease_and_nothing_else"
DEAD_CASES = [DEAD, NEVER, MIN_HOLD_DEAD, REAP]
PERMITS = "test_a_limited_key_gives_each_of_its_permits_once"
PERMIT_THREADS = "test_threads_contending_never_hold_more_than_the_limit"
LIMITS = "test_a_limit_that_disagrees_with_the_held_permits_is_refused_writing_nothing"
PERMIT_CASES = [PERMITS, PERMIT_THREADS, LIMITS]


def memory(backend: MemoryBackend, **hooks: Any) -> ContractBackend:
    leases = backend._leases

    def plant(stored: str, value: str, created_ago: Any, expires_in: Any) -> None:
        now = backend._clock()
        leases[caller_key(stored)] = _Lease(
            token=value,
            acquired=now - created_ago.total_seconds(),
            expires=now + expires_in.total_seconds(),
        )

    hooks = {
        "plant": plant,
        "stored_keys": lambda: {storage_key(key) for key in leases},
        **hooks,
    }
    return ContractBackend(name=type(backend).__name__, backend=backend, **hooks)


def server_clock_memory(backend: mutants.ServerClockMemory) -> ContractBackend:
    return memory(
        backend, skew_worker_clock=lambda offset: contextlib.nullcontext(backend.worker(offset))
    )


def sqlite(cls: type[DatabaseBackend]) -> ContractBackend:
    subject = database_backend("default")
    subject.backend = cls(using="default")
    return subject


def postgres(cls: type[DatabaseBackend]) -> ContractBackend:
    subject = database_backend("postgres")
    subject.backend = cls(using="postgres")
    recipe = subject.recipe
    assert recipe is not None
    subject.recipe = BackendRecipe(
        backend=f"{cls.__module__}.{cls.__qualname__}",
        kwargs=recipe.kwargs,
        settings=recipe.settings,
    )
    subject.skew_worker_clock = faketime_worker_clock(subject.recipe)
    return subject


#: class name -> (how to build the ContractBackend, the cases to run, databases used).
SUBJECTS: dict[str, tuple[Callable[[], ContractBackend], list[str], list[str]]] = {
    # Mutants: each must fail at least one of its cases.
    "ClearStaleReturnsZero": (lambda: memory(mutants.ClearStaleReturnsZero()), [CLEAR], []),
    "ClearStaleDoesNothing": (lambda: memory(mutants.ClearStaleDoesNothing()), [CLEAR], []),
    "DryRunDeletes": (lambda: memory(mutants.DryRunDeletes()), [CLEAR], []),
    "RefreshResurrects": (lambda: memory(mutants.RefreshResurrects()), [RESURRECT], []),
    "RefreshIgnoresCap": (lambda: memory(mutants.RefreshIgnoresCap()), [CAP], []),
    "AcquireIgnoresMaxLifetime": (
        lambda: memory(mutants.AcquireIgnoresMaxLifetime()),
        [FIRST],
        [],
    ),
    "ReleaseNotBoundToToken": (lambda: memory(mutants.ReleaseNotBoundToToken()), [TOKEN], []),
    "RefreshNotBoundToToken": (lambda: memory(mutants.RefreshNotBoundToToken()), [TOKEN], []),
    "AcquireNotExcluding": (lambda: memory(mutants.AcquireNotExcluding()), [EXCLUDE], []),
    "ExpiredNeverTakenOver": (lambda: memory(mutants.ExpiredNeverTakenOver()), [EXPIRED], []),
    "AbandonedNeverTakenOver": (
        lambda: memory(mutants.AbandonedNeverTakenOver()),
        [ABANDONED, CLEAR],
        [],
    ),
    "ListIncludesExpired": (lambda: memory(mutants.ListIncludesExpired()), [LISTING], []),
    "PeekIgnoresExpiry": (lambda: memory(mutants.PeekIgnoresExpiry()), [LISTING], []),
    "JudgesByWorkerClock": (
        lambda: server_clock_memory(mutants.JudgesByWorkerClock()),
        [CLOCK],
        [],
    ),
    "ClearStaleOutsideTheNamespace": (
        lambda: sqlite(mutants.ClearStaleOutsideTheNamespace),
        [NAMESPACE],
        ["default"],
    ),
    "DatabaseAcquireIgnoresMaxLifetime": (
        lambda: sqlite(mutants.DatabaseAcquireIgnoresMaxLifetime),
        [FIRST],
        ["default"],
    ),
    "DatabaseJudgesByWorkerClock": (
        lambda: postgres(mutants.DatabaseJudgesByWorkerClock),
        [CLOCK],
        ["postgres"],
    ),
    "TakesOverTheLiving": (lambda: memory(mutants.TakesOverTheLiving()), [NEVER], []),
    "DeadHolderKeepsTheKey": (lambda: memory(mutants.DeadHolderKeepsTheKey()), [DEAD], []),
    "TakesOverAMinHold": (lambda: memory(mutants.TakesOverAMinHold()), [MIN_HOLD_DEAD], []),
    "ReapsTheLiving": (lambda: memory(mutants.ReapsTheLiving()), [REAP], []),
    "GivesAPermitTwice": (
        lambda: memory(mutants.GivesAPermitTwice()),
        [PERMITS, PERMIT_THREADS],
        [],
    ),
    "MixesLimits": (lambda: memory(mutants.MixesLimits()), [LIMITS], []),
    # Controls: the correct backends pass the same cases.
    "ControlMemory": (
        lambda: memory(MemoryBackend()),
        [
            *[CLEAR, RESURRECT, CAP, FIRST, TOKEN, EXCLUDE, EXPIRED, ABANDONED, LISTING],
            *[*DEAD_CASES, *PERMIT_CASES],
        ],
        [],
    ),
    "ControlServerClockMemory": (
        lambda: server_clock_memory(mutants.ServerClockMemory()),
        [CLOCK],
        [],
    ),
    "ControlSqlite": (lambda: sqlite(DatabaseBackend), [NAMESPACE, FIRST], ["default"]),
    # Without the hooks a case needs: skipped, with the reason.
    "WithoutHooks": (
        lambda: ContractBackend(name="bare", backend=mutants.ServerClockMemory()),
        [CLEAR, CLOCK, ABANDONED],
        [],
    ),
}


def _make(name: str, build: Callable[[], ContractBackend], databases: list[str]) -> type:
    @pytest.fixture
    def contract_backend(self: Any) -> ContractBackend:
        if "postgres" in databases and "postgres" not in settings.DATABASES:
            pytest.skip("postgres not available")
        return build()

    cls = type(f"Test{name}", (BackendContract,), {"contract_backend": contract_backend})
    if databases:
        cls = pytest.mark.django_db(transaction=True, databases=databases)(cls)
    return cls


for _name, (_build, _cases, _databases) in SUBJECTS.items():
    globals()[f"Test{_name}"] = _make(_name, _build, _databases)
