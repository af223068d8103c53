"""Contract cases: the permits of a ``limit=N`` key, each a lease of its own.

A backend with the capability ``permits`` gives at most N live permits of one
key at once, never one slot to two holders, and refuses a limit that
disagrees with the permits (or the mutex's lease) held now. A backend
without it has these cases skipped, with that reason.
"""

from __future__ import annotations

import functools
import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest

from django_tasklock.backends.base import (
    BaseBackend,
    Refresh,
    Released,
    limited_key,
    longest_limited_key,
    permit_key,
)
from django_tasklock.exceptions import LimitMismatch
from django_tasklock.leases.lease import new_token
from django_tasklock.testing.support import (
    LIFE,
    LONG,
    ContractBackend,
    cross_process_recipe,
    wait_until,
)
from django_tasklock.testing.workers import contend_for_permits


def take(backend: BaseBackend, key: str, token: str, limit: int) -> str | None:
    """``backend.acquire_permit`` with the cases' ttl and cap."""
    return backend.acquire_permit(key, token, limit=limit, ttl=LONG, max_lifetime=LIFE)


def run_threads(targets: list[Callable[[], None]]) -> None:
    """Run each of ``targets`` in a thread of its own, and wait (2 minutes at most) for all."""
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)


class PermitCases:
    """``acquire_permit``: at most ``limit`` holders of one key, each bound to its token."""

    @pytest.fixture
    def permits_backend(self, contract_backend: ContractBackend) -> BaseBackend:
        backend = contract_backend.backend
        if not backend.capabilities.permits:
            pytest.skip(f"{contract_backend.name}: no permits (the capability 'permits' is off)")
        return backend

    def test_a_limited_key_gives_each_of_its_permits_once(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        backend = permits_backend
        tokens = [new_token() for _ in range(4)]
        names = [take(backend, key, t, 3) for t in tokens]
        assert names[3] is None  # all three held
        taken = [name for name in names if name is not None]
        assert sorted(taken) == sorted(permit_key(key, slot) for slot in range(3))
        assert sorted(limited_key(name) for name in taken) == [(key, 0), (key, 1), (key, 2)]
        for name in taken:
            held = backend.peek(name)
            assert held is not None
            assert held.key == name
            assert held.limit == 3  # what operators are shown: "n of 3"
        listed = [lock for lock in backend.list() if limited_key(lock.key)[0] == key]
        assert sorted((lock.key, lock.limit) for lock in listed) == [(n, 3) for n in sorted(taken)]
        # One released: the fourth gets exactly that one, nobody gets a fourth.
        assert backend.release(taken[1], tokens[1])
        assert take(backend, key, tokens[3], 3) == (taken[1])
        assert take(backend, key, new_token(), 3) is None
        for name, token in ((taken[0], tokens[0]), (taken[1], tokens[3]), (taken[2], tokens[2])):
            assert backend.release(name, token)

    def test_the_longest_key_a_limit_allows_works_and_a_longer_one_is_refused(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        """A permit's name (key, separator, slot) must fit where a stored key fits."""
        backend = permits_backend
        for limit in (2, 11):
            longest = longest_limited_key(limit)
            long_key = (key * 30)[:longest]
            tokens = [new_token() for _ in range(limit)]
            names = [take(backend, long_key, token, limit) for token in tokens]
            assert None not in names
            for name, token in zip(names, tokens, strict=True):
                assert name is not None
                held = backend.peek(name)
                assert held is not None
                assert held.key == name  # whole: not cut by the storage
                assert backend.release(name, token)
            with pytest.raises(ValueError, match="key must be at most"):
                take(backend, long_key + "x", new_token(), limit)

    def test_a_release_of_a_permit_its_token_never_held_is_a_loss_not_gone(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        """``GONE`` only for the permit this release ended before: a token that released
        its permit 0 and names permit 1 (another's) or 2 (nobody's) gets ``LOST``."""
        backend = permits_backend
        token, other = new_token(), new_token()
        mine, theirs = permit_key(key, 0), permit_key(key, 1)
        assert (take(backend, key, token, 3), take(backend, key, other, 3)) == (mine, theirs)
        assert backend.release_outcome(mine, token) is Released.RELEASED
        assert backend.release_outcome(theirs, token) is Released.LOST
        assert backend.release_outcome(permit_key(key, 2), token) is Released.LOST
        assert backend.peek(theirs) is not None  # untouched
        assert backend.release(theirs, other)

    def test_a_limit_under_two_is_refused_naming_limit_and_writing_nothing(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        """A permit is of a limited key: ``limit=1`` is the mutex's ``acquire``."""
        backend = permits_backend
        for limit in (1, 0, -1, True):
            with pytest.raises(ValueError, match="limit"):
                take(backend, key, new_token(), limit)
        assert backend.peek(key) is None
        assert [lock for lock in backend.list() if limited_key(lock.key)[0] == key] == []
        assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)  # no mismatch

    def test_a_permit_sent_again_is_the_same_permit(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        backend = permits_backend
        token = new_token()
        first = take(backend, key, token, 2)
        again = take(backend, key, token, 2)
        assert first is not None
        assert again == first
        other = new_token()
        second = take(backend, key, other, 2)
        assert second is not None
        assert second != first
        assert backend.release(first, token)
        assert backend.release(second, other)

    def test_a_permit_asked_for_after_its_min_hold_release_is_not_given_again(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        """An acquisition arriving late, after the release that cut its permit, writes nothing."""
        backend = permits_backend
        token = new_token()
        name = take(backend, key, token, 2)
        assert name is not None
        assert backend.release(name, token, min_hold=timedelta(seconds=20))
        assert take(backend, key, token, 2) is None
        other = new_token()
        assert take(backend, key, other, 2) is not None  # the late one took no slot
        assert take(backend, key, new_token(), 2) is None

    def test_each_permit_is_refreshed_and_released_by_its_own_token_only(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        backend = permits_backend
        a, b = new_token(), new_token()
        first = take(backend, key, a, 2)
        second = take(backend, key, b, 2)
        assert first is not None
        assert second is not None
        assert not backend.refresh(first, b, ttl=LONG, max_lifetime=LIFE)
        assert not backend.release(first, b)
        assert backend.refresh(first, a, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(first, a)
        assert backend.peek(first) is None
        assert backend.peek(second) is not None  # the other permit is untouched
        assert backend.refresh(second, b, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(second, b)

    def test_permits_and_leases_refreshed_together_are_each_answered_for_itself(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        """The heartbeat's ``refresh_many`` with permits among leases: each bound to its own."""
        backend = permits_backend
        a, b, mutex = new_token(), new_token(), new_token()
        first = take(backend, key, a, 2)
        second = take(backend, key, b, 2)
        assert first is not None
        assert second is not None
        assert backend.acquire(f"{key}-m", mutex, ttl=LONG, max_lifetime=LIFE)
        short = timedelta(seconds=0.3)
        items = [
            Refresh(first, a, LONG, LIFE),
            Refresh(f"{key}-m", mutex, LONG, LIFE),
            Refresh(second, a, LONG, LIFE),  # b's permit: not a's to refresh
            Refresh(second, b, short, LIFE),
            Refresh(key, a, LONG, LIFE),  # the limited key's name is no lease
        ]
        assert backend.refresh_many(items) == [True, True, False, True, False]
        # Each permit's end is its own: the one refreshed to 0.3 s runs out alone.
        wait_until(lambda: backend.peek(second) is None, timeout=30, step=0.05)
        assert backend.peek(first) is not None
        assert backend.refresh_many(
            [Refresh(first, a, LONG, LIFE), Refresh(second, b, LONG, LIFE)]
        ) == [
            True,
            False,
        ]  # an expired permit is never revived
        assert backend.release(first, a)
        assert backend.release(f"{key}-m", mutex)

    def test_an_expired_permit_is_taken_over(self, permits_backend: BaseBackend, key: str) -> None:
        backend = permits_backend
        short = timedelta(seconds=0.3)
        first = backend.acquire_permit(key, new_token(), limit=2, ttl=short, max_lifetime=LIFE)
        second = take(backend, key, new_token(), 2)
        assert first is not None
        assert second is not None
        late = new_token()
        assert take(backend, key, late, 2) is None
        taken: list[str | None] = []

        def takes() -> bool:
            taken.append(take(backend, key, late, 2))
            return taken[-1] is not None

        wait_until(takes, timeout=30, step=0.05)
        assert taken[-1] == first  # the expired one, not the live one
        assert take(backend, key, new_token(), 2) is None

    def test_a_dead_holders_permit_is_taken_over_and_a_live_ones_never(
        self, permits_backend: BaseBackend, key: str, contract_backend: ContractBackend
    ) -> None:
        """With ``dead_holders``: a permit whose holder is provably gone frees its slot at once."""
        from django_tasklock.testing.cases_dead import dead_token, proofs_here, takes_over

        backend = permits_backend
        takes_over(backend, contract_backend.name)
        proofs_here()
        dead, live = dead_token(), new_token()
        first = take(backend, key, live, 2)
        second = take(backend, key, dead, 2)
        assert first is not None
        assert second is not None
        token = new_token()
        assert take(backend, key, token, 2) == second
        assert not backend.refresh(second, dead, ttl=LONG, max_lifetime=LIFE)  # nobody's now
        assert take(backend, key, new_token(), 2) is None
        assert backend.release(first, live)
        assert backend.release(second, token)

    def test_a_limit_that_disagrees_with_the_held_permits_is_refused_writing_nothing(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        backend = permits_backend
        token = new_token()
        name = take(backend, key, token, 3)
        assert name is not None
        with pytest.raises(LimitMismatch, match="limit=3") as refused:
            take(backend, key, new_token(), 2)
        assert (refused.value.held, refused.value.asked) == (3, 2)
        with pytest.raises(LimitMismatch) as refused:
            backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)  # a mutex: limit 1
        assert (refused.value.held, refused.value.asked) == (3, 1)
        assert backend.peek(key) is None
        assert [h.key for h in backend.list() if limited_key(h.key)[0] == key] == [name]
        # Neither an operator's force release of the key's name nor a sweep
        # lets a mutex in beside the permit.
        assert backend.force_release(key) is None
        backend.clear_stale()
        with pytest.raises(LimitMismatch):
            backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        assert backend.release(name, token)

        # Nothing of limit 3 held now: another limit is served.
        mutex = new_token()
        assert backend.acquire(key, mutex, ttl=LONG, max_lifetime=LIFE)
        seen = backend.peek(key)
        assert seen is not None
        assert seen.limit is None  # a mutex's lease
        with pytest.raises(LimitMismatch) as refused:
            take(backend, key, new_token(), 2)
        assert (refused.value.held, refused.value.asked) == (1, 2)
        assert backend.release(key, mutex)
        other = new_token()
        name = take(backend, key, other, 2)
        assert name is not None
        assert backend.release(name, other)

    def test_fences_of_a_limited_key_increase_across_its_permits(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        backend = permits_backend
        if type(backend).fence is BaseBackend.fence:
            pytest.skip("no fencing tokens (fence() not implemented)")
        fences: list[int] = []
        for _ in range(3):
            token = new_token()
            name = take(backend, key, token, 2)
            assert name is not None
            fence = backend.fence(name, token)
            assert fence is not None
            fences.append(fence)
            if len(fences) % 2:  # one held, one released: both slots used
                continue
            assert backend.release(name, token)
        assert fences == sorted(set(fences)), fences  # strictly increasing, whichever slot

    def test_processes_contending_never_hold_more_than_the_limit(
        self, permits_backend: BaseBackend, contract_backend: ContractBackend, key: str
    ) -> None:
        """6 processes for 3 permits: never more than 3 holds at once, never one permit twice."""
        recipe = cross_process_recipe(contract_backend)
        ctx = multiprocessing.get_context("spawn")
        n, limit = 6, 3
        barrier = ctx.Barrier(n)
        results = ctx.Queue()
        args = (recipe, key, limit, 2.5, 0.02, barrier, results)
        procs = [ctx.Process(target=contend_for_permits, args=args) for _ in range(n)]
        for proc in procs:
            proc.start()
        reports = [results.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=10)
        holds = [hold for _, held, _ in reports for hold in held]
        edges = sorted(
            [(start, 1, name) for start, _, name in holds]
            + [(end, -1, name) for _, end, name in holds],
            key=lambda edge: (edge[0], edge[1]),
        )  # at one instant, an end before a start
        at_once, most, names = 0, 0, Counter[str]()
        for _, step, name in edges:
            at_once += step
            names[name] += step
            most = max(most, at_once)
            assert names[name] <= 1, f"{name!r} held by two processes at once"
        assert most <= limit
        assert most >= 2, "the permits were never held together"
        assert sum(refused for _, _, refused in reports) > 0, "there was no contention"
        assert len(holds) >= 20

    def test_threads_contending_never_hold_more_than_the_limit(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        """8 threads x 30 rounds for 3 permits: never one permit to two, never more than 3."""
        backend = permits_backend
        lock = threading.Lock()
        holding: dict[str, str] = {}  # permit -> token, as the holders say
        most = [0]
        errors: list[str] = []

        def worker() -> None:
            try:
                rounds()
            finally:
                backend.close()  # this thread's connections, if the storage gave it some

        def rounds() -> None:
            for _ in range(30):
                token = new_token()
                name = take(backend, key, token, 3)
                if name is None:
                    time.sleep(0.001)
                    continue
                with lock:
                    if name in holding:
                        errors.append(f"{name!r} given to two holders")
                    holding[name] = token
                    most[0] = max(most[0], len(holding))
                time.sleep(0.005)
                with lock:
                    holding.pop(name, None)
                if not backend.release(name, token):
                    errors.append(f"{name!r} was not {token}'s at its release")

        run_threads([worker] * 8)
        assert not errors, errors[:5]
        assert 1 <= most[0] <= 3

    def test_a_mutex_and_permits_of_one_name_are_never_held_together(
        self, permits_backend: BaseBackend, key: str
    ) -> None:
        """Threads asking for the key as a mutex and as ``limit=2`` at once: one kind at a time."""
        backend = permits_backend
        lock = threading.Lock()
        holding: dict[str, int] = {"mutex": 0, "permits": 0}
        errors: list[str] = []
        refused = [0]

        def take_either(mutex: bool) -> tuple[str, str] | None:
            token = new_token()
            try:
                if mutex:
                    taken = backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
                    return (key, token) if taken else None
                name = take(backend, key, token, 2)
                return None if name is None else (name, token)
            except LimitMismatch:
                with lock:
                    refused[0] += 1
                return None

        def rounds(mutex: bool) -> None:
            kind = "mutex" if mutex else "permits"
            for _ in range(25):
                taken = take_either(mutex)
                if taken is None:
                    time.sleep(0.001)
                    continue
                with lock:
                    holding[kind] += 1
                    other = holding["permits" if mutex else "mutex"]
                    if other:
                        errors.append(f"a {kind} held beside {other} of the other kind")
                time.sleep(0.003)
                with lock:
                    holding[kind] -= 1
                if not backend.release(*taken):
                    errors.append(f"{taken[0]!r} was not its taker's at its release")

        def worker(mutex: bool) -> None:
            try:
                rounds(mutex)
            finally:
                backend.close()

        run_threads([functools.partial(worker, i % 2 == 0) for i in range(6)])
        assert not errors, errors[:5]
