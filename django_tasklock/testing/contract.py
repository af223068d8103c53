"""The contract every provider honours (SPEC §3), as a pytest suite.

Subclass :class:`ProviderContract` and give it a ``contract_backend`` fixture
returning a :class:`ContractBackend` for your provider::

    class TestMyProvider(ProviderContract):
        @pytest.fixture
        def contract_backend(self):
            return ContractBackend(name="mine", provider=MyProvider(), ...)

Cases that need something a provider cannot offer (another process, a way to
plant raw rows) say so by a capability flag or a missing hook and are skipped
with that reason, never silently.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_tasklock.backends.base import KEY_PREFIX, BaseProvider, HeldLock, storage_key
from django_tasklock.service import TaskLockService, new_token
from django_tasklock.signals import lock_acquired, lock_lost, lock_released
from django_tasklock.testing.faults import FaultyProvider
from django_tasklock.testing.workers import ProviderRecipe, contend, hold_until_killed

#: Slack for timing assertions on a loaded machine.
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


def _require(backend: ContractBackend, hook: str) -> Any:
    value = getattr(backend, hook)
    if value is None:
        pytest.skip(f"{backend.name}: the contract backend gives no {hook!r} hook")
    return value


def _wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.02) -> float:
    """Poll until ``predicate()``; return the monotonic time it first held."""
    end = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        if predicate():
            return now
        if now > end:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


class _Signals:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, signal: Any, sender: Any, **kwargs: Any) -> None:
        name = {id(lock_acquired): "acquired", id(lock_released): "released"}.get(
            id(signal), "lost"
        )
        self.sent.append((name, kwargs))


class ProviderContract:
    """SPEC §3 semantics, 1 to 10, against ``contract_backend``."""

    @pytest.fixture
    def contract_backend(self) -> ContractBackend:  # pragma: no cover - subclasses give it
        raise NotImplementedError("define a contract_backend fixture")

    @pytest.fixture
    def backend(self, contract_backend: ContractBackend) -> ContractBackend:
        return contract_backend

    @pytest.fixture
    def provider(self, backend: ContractBackend) -> BaseProvider:
        return backend.provider

    @pytest.fixture
    def service(self, provider: BaseProvider) -> TaskLockService:
        return TaskLockService(provider)

    @pytest.fixture
    def key(self) -> str:
        return f"contract-{uuid.uuid4().hex[:12]}"

    @pytest.fixture
    def signals(self) -> Iterator[_Signals]:
        recorder = _Signals()
        for sig in (lock_acquired, lock_released, lock_lost):
            sig.connect(recorder, weak=False)
        yield recorder
        for sig in (lock_acquired, lock_released, lock_lost):
            sig.disconnect(recorder)

    # -- 1. mutual exclusion ------------------------------------------------

    def test_second_acquire_of_a_held_key_is_refused(
        self, provider: BaseProvider, key: str
    ) -> None:
        ttl, life = timedelta(seconds=30), timedelta(hours=1)
        assert provider.acquire(key, new_token(), ttl=ttl, max_lifetime=life)
        assert not provider.acquire(key, new_token(), ttl=ttl, max_lifetime=life)
        assert provider.acquire(key + "-other", new_token(), ttl=ttl, max_lifetime=life)

    def test_threads_racing_for_a_key_let_exactly_one_run(
        self, service: TaskLockService, key: str
    ) -> None:
        barrier = threading.Barrier(8)
        outcomes: list[bool] = []

        def worker() -> None:
            barrier.wait()
            try:
                outcomes.append(service.run_exclusive(key, lambda: time.sleep(0.5)).acquired)
            finally:
                service.provider.close()  # the thread's connections die with it

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == [False] * 7 + [True]

    def test_processes_racing_never_overlap(self, backend: ContractBackend, key: str) -> None:
        recipe = self._cross_process(backend)
        ctx = multiprocessing.get_context("spawn")
        n = 6
        barrier = ctx.Barrier(n)
        results = ctx.Queue()
        procs = [
            ctx.Process(target=contend, args=(recipe, key, 2.5, 0.01, barrier, results))
            for _ in range(n)
        ]
        for proc in procs:
            proc.start()
        reports = [results.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(timeout=10)
        intervals = sorted(i for _, held, _ in reports for i in held)
        overlaps = [(a, b) for a, b in itertools.pairwise(intervals) if b[0] < a[1]]
        assert overlaps == []
        assert len({pid for pid, held, _ in reports if held}) >= 2, "only one process ever won"
        assert sum(refused for _, _, refused in reports) > 0, "there was no contention"
        assert len(intervals) >= 20

    # -- 2. token ------------------------------------------------------------

    def test_holder_names_host_and_pid_and_tokens_differ(
        self, provider: BaseProvider, key: str
    ) -> None:
        token = new_token()
        assert provider.acquire(key, token, ttl=timedelta(seconds=30), max_lifetime=LIFE)
        held = provider.peek(key)
        assert held is not None
        assert (held.holder.host, held.holder.pid) == (socket.gethostname(), os.getpid())
        assert token.split(":")[-1] not in str(held)
        assert len({new_token() for _ in range(100)}) == 100

    def test_refresh_and_release_are_bound_to_the_token(
        self, provider: BaseProvider, key: str
    ) -> None:
        ttl, life = timedelta(seconds=30), timedelta(hours=1)
        token, intruder = new_token(), new_token()
        assert provider.acquire(key, token, ttl=ttl, max_lifetime=life)
        assert not provider.refresh(key, intruder, ttl=ttl, max_lifetime=life)
        assert not provider.release(key, intruder)
        assert provider.peek(key) is not None
        assert provider.refresh(key, token, ttl=ttl, max_lifetime=life)
        assert provider.release(key, token)
        assert provider.peek(key) is None
        assert not provider.release(key, token)

    # -- 3. heartbeat ----------------------------------------------------------

    def test_refresh_extends_a_live_lease(self, provider: BaseProvider, key: str) -> None:
        token, life = new_token(), timedelta(hours=1)
        assert provider.acquire(key, token, ttl=timedelta(seconds=1), max_lifetime=life)
        time.sleep(0.5)
        assert provider.refresh(key, token, ttl=timedelta(seconds=1), max_lifetime=life)
        time.sleep(0.7)  # past the first lease's end
        held = provider.peek(key)
        assert held is not None
        assert 0 < held.seconds_left <= 1

    def test_refresh_never_resurrects_an_expired_lease(
        self, provider: BaseProvider, key: str
    ) -> None:
        token, life = new_token(), timedelta(hours=1)
        assert provider.acquire(key, token, ttl=timedelta(seconds=0.3), max_lifetime=life)
        time.sleep(0.5)
        assert not provider.refresh(key, token, ttl=timedelta(seconds=30), max_lifetime=life)
        assert provider.peek(key) is None

    def test_heartbeat_keeps_work_longer_than_ttl_exclusive(
        self, service: TaskLockService, provider: BaseProvider, key: str
    ) -> None:
        rivals: list[bool] = []

        def work() -> str:
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                rivals.append(provider.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE))
                time.sleep(0.1)
            return "done"

        result = service.run_exclusive(key, work, ttl=0.6, refresh_interval=0.2)
        assert (result.acquired, result.result, result.lost) == (True, "done", False)
        assert rivals
        assert not any(rivals)
        assert provider.peek(key) is None

    # -- 4. hard deadline --------------------------------------------------------

    def test_storage_caps_refresh_at_max_lifetime(self, provider: BaseProvider, key: str) -> None:
        token, life = new_token(), timedelta(seconds=1.2)
        assert provider.acquire(key, token, ttl=timedelta(seconds=1), max_lifetime=life)
        time.sleep(0.5)
        assert provider.refresh(key, token, ttl=timedelta(seconds=30), max_lifetime=life)
        held = provider.peek(key)
        assert held is not None
        assert held.seconds_left <= 0.7 + SLACK / 2
        time.sleep(0.9)
        assert provider.peek(key) is None
        assert provider.acquire(key, new_token(), ttl=LONG, max_lifetime=life)

    def test_work_past_max_lifetime_loses_the_key(
        self,
        service: TaskLockService,
        provider: BaseProvider,
        key: str,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        taken_after: list[float] = []

        def runaway() -> None:
            start = time.monotonic()
            when = _wait_until(
                lambda: provider.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE),
                timeout=4,
                step=0.05,
            )
            taken_after.append(when - start)

        with caplog.at_level(logging.WARNING, logger="django_tasklock"):
            result = service.run_exclusive(
                key, runaway, ttl=0.5, refresh_interval=0.15, max_lifetime=1.0
            )
        assert 1.0 - SLACK <= taken_after[0] <= 1.0 + SLACK
        assert "max_lifetime" in caplog.text
        assert result.lost

    # -- 5. reclaim --------------------------------------------------------------

    def test_expired_lease_is_taken_over(self, provider: BaseProvider, key: str) -> None:
        life = timedelta(hours=1)
        assert provider.acquire(key, new_token(), ttl=timedelta(seconds=0.3), max_lifetime=life)
        assert not provider.acquire(key, new_token(), ttl=LONG, max_lifetime=life)
        time.sleep(0.45)
        assert provider.acquire(key, new_token(), ttl=LONG, max_lifetime=life)

    def test_lease_older_than_24_hours_is_taken_over(
        self, backend: ContractBackend, provider: BaseProvider, key: str
    ) -> None:
        plant = _require(backend, "plant")
        plant(storage_key(key), new_token(), timedelta(hours=25), timedelta(hours=1))
        assert provider.peek(key) is None
        assert provider.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)

    def test_killed_holder_is_reclaimed_after_its_ttl_and_not_before(
        self, backend: ContractBackend, provider: BaseProvider, key: str
    ) -> None:
        recipe = self._cross_process(backend)
        ttl, interval = 1.5, 0.5
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=hold_until_killed, args=(recipe, key, ttl, interval, theirs))
        proc.start()
        try:
            assert ours.poll(60), "the holder never reported"
            assert proc.pid is not None
            assert ours.recv() == ("acquired", proc.pid)
            time.sleep(2 * ttl)  # its heartbeat keeps it past the ttl
            held = provider.peek(key)
            assert held is not None
            assert held.holder.pid == proc.pid
            os.kill(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            proc.join(5)
            life = timedelta(hours=1)
            reclaimed = _wait_until(
                lambda: provider.acquire(key, new_token(), ttl=LONG, max_lifetime=life),
                timeout=ttl + 5,
            )
        finally:
            if proc.is_alive():
                proc.kill()
        assert ttl - interval - SLACK <= reclaimed - killed <= ttl + SLACK

    # -- 6. release --------------------------------------------------------------

    @pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt, SystemExit])
    def test_release_on_every_exit_and_the_exception_propagates(
        self, service: TaskLockService, provider: BaseProvider, key: str, exc: type[BaseException]
    ) -> None:
        raised = exc("boom")

        def fail() -> None:
            assert provider.peek(key) is not None
            raise raised

        with pytest.raises(exc) as info:
            service.run_exclusive(key, fail)
        assert info.value is raised
        assert provider.peek(key) is None

    def test_run_exclusive_returns_the_result_and_releases(
        self, service: TaskLockService, provider: BaseProvider, key: str, signals: _Signals
    ) -> None:
        result = service.run_exclusive(key, lambda: provider.peek(key))
        assert result.acquired
        assert not result.lost
        assert isinstance(result.result, HeldLock)
        assert result.result.key == key
        assert provider.peek(key) is None
        assert [name for name, _ in signals.sent] == ["acquired", "released"]
        assert all(kw["key"] == key and kw["holder"].pid == os.getpid() for _, kw in signals.sent)

    def test_held_key_runs_nothing_and_calls_on_locked(
        self, service: TaskLockService, provider: BaseProvider, key: str
    ) -> None:
        assert provider.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        ran: list[str] = []
        result = service.run_exclusive(
            key, lambda: ran.append("fn"), on_locked=lambda: ran.append("on_locked")
        )
        assert (result.acquired, result.result, result.lost) == (False, None, False)
        assert ran == ["on_locked"]

    # -- 7. lost lock ------------------------------------------------------------

    def test_lost_lock_is_reported_and_the_new_holder_keeps_it(
        self,
        service: TaskLockService,
        provider: BaseProvider,
        key: str,
        signals: _Signals,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        usurper = new_token()

        def work() -> None:
            assert provider.force_release(key)
            assert provider.acquire(key, usurper, ttl=LONG, max_lifetime=LIFE)
            _wait_until(lambda: any(name == "lost" for name, _ in signals.sent), timeout=3)

        with caplog.at_level(logging.WARNING, logger="django_tasklock"):
            result = service.run_exclusive(key, work, ttl=0.6, refresh_interval=0.2)
        assert result.acquired
        assert result.lost
        assert "was lost" in caplog.text
        lost = [kw for name, kw in signals.sent if name == "lost"]
        assert len(lost) == 1
        assert lost[0]["key"] == key
        assert usurper.split(":")[-1] not in repr(lost[0])
        assert provider.release(key, usurper), "the loser's release deleted the new lease"

    def test_lock_lost_before_the_first_refresh_is_found_at_release(
        self, service: TaskLockService, provider: BaseProvider, key: str
    ) -> None:
        usurper = new_token()

        def work() -> None:
            provider.force_release(key)
            provider.acquire(key, usurper, ttl=LONG, max_lifetime=LIFE)

        assert service.run_exclusive(key, work).lost
        assert provider.release(key, usurper)

    def test_transient_refresh_failures_are_retried(
        self, provider: BaseProvider, key: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        faulty = FaultyProvider(provider, refresh_failures=2)
        with caplog.at_level(logging.WARNING, logger="django_tasklock"):
            result = TaskLockService(faulty).run_exclusive(
                key, lambda: time.sleep(1.6), ttl=1.0, refresh_interval=0.2
            )
        assert faulty.refresh_calls >= 4
        assert result.acquired
        assert not result.lost
        assert caplog.text.count("retrying") == 2

    # -- 8. errors are not "held" --------------------------------------------------

    def test_unreachable_storage_raises_instead_of_held(self, backend: ContractBackend) -> None:
        unreachable = _require(backend, "unreachable")()
        ran: list[bool] = []
        with pytest.raises(Exception) as info:  # noqa: PT011 - each storage has its own
            TaskLockService(unreachable).run_exclusive("k", lambda: ran.append(True))
        assert not isinstance(info.value, (TypeError, ValueError))
        assert ran == []

    def test_failed_release_is_logged_and_keeps_the_result(
        self, provider: BaseProvider, key: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        faulty = FaultyProvider(provider, release_fails=True)
        with caplog.at_level(logging.WARNING, logger="django_tasklock"):
            result = TaskLockService(faulty).run_exclusive(key, lambda: "kept", ttl=0.5)
        assert (result.acquired, result.result) == (True, "kept")
        assert "will expire by itself" in caplog.text
        _wait_until(lambda: provider.peek(key) is None, timeout=2)

    def test_failed_release_does_not_replace_the_exception(
        self, provider: BaseProvider, key: str
    ) -> None:
        faulty = FaultyProvider(provider, release_fails=True)
        with pytest.raises(LookupError):
            TaskLockService(faulty).run_exclusive(
                key, lambda: dict[str, int]()["missing"], ttl=0.5
            )

    # -- 10. namespacing -------------------------------------------------------------

    def test_stored_key_is_exactly_prefixed(self, backend: ContractBackend, key: str) -> None:
        stored_keys = _require(backend, "stored_keys")
        token = new_token()
        assert backend.provider.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert KEY_PREFIX + key in stored_keys()
        assert backend.provider.release(key, token)
        assert KEY_PREFIX + key not in stored_keys()

    def test_entries_outside_the_namespace_are_never_touched(
        self, backend: ContractBackend, key: str
    ) -> None:
        put_foreign, stored_keys = (
            _require(backend, "put_foreign"),
            _require(backend, "stored_keys"),
        )
        provider = backend.provider
        foreign = {f"cache:{key}", f"task-lock{key}", key}
        for stored in foreign:
            put_foreign(stored)
        provider.acquire(key, new_token(), ttl=timedelta(seconds=0.2), max_lifetime=LIFE)
        time.sleep(0.3)
        provider.clear_stale()
        assert not provider.force_release(f"../{key}")
        assert all(held.key != key for held in provider.list())
        assert foreign <= stored_keys()

    # -- operating: peek, list, clear_stale ----------------------------------------------

    def test_peek_and_list_show_live_leases_only(self, provider: BaseProvider, key: str) -> None:
        life = timedelta(hours=1)
        assert provider.acquire(
            key + "-b", new_token(), ttl=timedelta(seconds=30), max_lifetime=life
        )
        assert provider.acquire(
            key + "-a", new_token(), ttl=timedelta(seconds=30), max_lifetime=life
        )
        assert provider.acquire(
            key + "-x", new_token(), ttl=timedelta(seconds=0.2), max_lifetime=life
        )
        time.sleep(0.3)
        mine = [held for held in provider.list() if held.key.startswith(key)]
        assert [held.key for held in mine] == [key + "-a", key + "-b"]
        for held in mine:
            assert held.acquired_at < held.expires_at
            assert 29 <= held.seconds_left <= 30
            assert abs((held.expires_at - held.acquired_at).total_seconds() - 30) < 1
        assert provider.peek(key + "-x") is None

    def test_clear_stale_deletes_expired_and_abandoned_leases_only(
        self, backend: ContractBackend, provider: BaseProvider, key: str
    ) -> None:
        life = timedelta(hours=1)
        assert provider.acquire(key + "-live", new_token(), ttl=LONG, max_lifetime=life)
        assert provider.acquire(
            key + "-gone", new_token(), ttl=timedelta(seconds=0.2), max_lifetime=life
        )
        if backend.plant is not None:
            backend.plant(storage_key(key + "-old"), new_token(), timedelta(hours=25), LIFE)
        time.sleep(0.3)
        before = provider.clear_stale(dry_run=True)
        assert provider.clear_stale() == before
        assert provider.clear_stale() == 0
        assert provider.peek(key + "-live") is not None
        assert provider.force_release(key + "-live")

    # -- bad input ---------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("kwargs", "error", "names"),
        [
            ({"key": ""}, ValueError, "key"),
            ({"key": 7}, TypeError, "key"),
            ({"key": "k" * 246}, ValueError, "key"),
            ({"fn": "not callable"}, TypeError, "fn"),
            ({"ttl": 0}, ValueError, "ttl"),
            ({"ttl": -1}, ValueError, "ttl"),
            ({"ttl": timedelta(0)}, ValueError, "ttl"),
            ({"ttl": "60"}, TypeError, "ttl"),
            ({"ttl": True}, TypeError, "ttl"),
            ({"ttl": float("nan")}, ValueError, "ttl"),
            ({"refresh_interval": 0}, ValueError, "refresh_interval"),
            ({"ttl": 10, "refresh_interval": 10}, ValueError, "refresh_interval"),
            ({"max_lifetime": 0}, ValueError, "max_lifetime"),
            ({"max_lifetime": timedelta(hours=24, seconds=1)}, ValueError, "max_lifetime"),
            ({"on_locked": 3}, TypeError, "on_locked"),
        ],
    )
    def test_bad_input_is_rejected_before_anything_is_written(
        self,
        provider: BaseProvider,
        key: str,
        kwargs: dict[str, Any],
        error: type[Exception],
        names: str,
    ) -> None:
        ran: list[bool] = []
        call: dict[str, Any] = {"key": key, "fn": lambda: ran.append(True), **kwargs}
        with pytest.raises(error, match=names):
            TaskLockService(provider).run_exclusive(call.pop("key"), call.pop("fn"), **call)
        assert ran == []
        assert provider.peek(key) is None

    def test_longest_key_is_accepted(self, service: TaskLockService, key: str) -> None:
        longest = (key + "k" * 245)[:245]
        assert service.run_exclusive(longest, lambda: True).result is True

    # -- helpers -----------------------------------------------------------------------

    def _cross_process(self, backend: ContractBackend) -> ProviderRecipe:
        if not backend.provider.capabilities.cross_process:
            pytest.skip(f"{backend.name}: capability cross_process=False (one process only)")
        recipe = _require(backend, "recipe")
        assert isinstance(recipe, ProviderRecipe)
        return recipe
