"""Contract cases: fencing tokens, strictly increasing per key whatever happens."""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import pytest

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import BaseBackend, storage_key
from django_tasklock.leases.lease import new_token
from django_tasklock.testing.support import (
    LIFE,
    LONG,
    ContractBackend,
    cross_process_recipe,
    require,
)
from django_tasklock.testing.workers import BackendRecipe, fenced_write, hold_fenced

_TTL, _INTERVAL = 1.0, 0.3


class FencingCases:
    """``fence()`` and ``fencing=True``: a number the protected resource can trust.

    Fencing is optional: a backend that leaves ``fence()`` unimplemented has
    these cases skipped, with that reason.
    """

    @pytest.fixture
    def fencing_backend(self, contract_backend: ContractBackend) -> BaseBackend:
        backend = contract_backend.backend
        if type(backend).fence is BaseBackend.fence:
            pytest.skip(f"{contract_backend.name}: no fencing tokens (fence() not implemented)")
        return backend

    def _grant(self, backend: BaseBackend, key: str, ttl: timedelta = LONG) -> tuple[str, int]:
        token = new_token()
        assert backend.acquire(key, token, ttl=ttl, max_lifetime=LIFE)
        fence = backend.fence(key, token)
        assert fence is not None
        return token, fence

    def test_fences_increase_across_release_expiry_force_release_and_sweeps(
        self, service: TaskLockService, fencing_backend: BaseBackend, key: str
    ) -> None:
        backend = fencing_backend
        token, first = self._grant(backend, key)
        assert backend.release(key, token)
        _, after_release = self._grant(backend, key, ttl=timedelta(seconds=0.2))
        time.sleep(0.3)
        assert backend.clear_stale() >= 0
        _, after_expiry = self._grant(backend, key)
        assert backend.force_release(key)
        with service.lock(key, fencing=True) as lock:
            after_force = lock.fence
        result = service.run_exclusive(key, lambda: None, fencing=True)
        assert after_force is not None
        assert result.fence is not None
        fences = [first, after_release, after_expiry, after_force, result.fence]
        assert fences == sorted(set(fences)), fences  # strictly increasing
        # The counter is no lock: it is not listed and does not hold the key.
        assert backend.peek(key) is None
        assert key not in {held.key for held in backend.list()}
        assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)

    def test_fences_survive_an_abandoned_lease_taken_over(
        self, contract_backend: ContractBackend, fencing_backend: BaseBackend, key: str
    ) -> None:
        backend = fencing_backend
        plant = require(contract_backend, "plant")
        token, before = self._grant(backend, key)
        assert backend.release(key, token)
        plant(storage_key(key), new_token(), timedelta(hours=25), timedelta(hours=1))
        assert backend.clear_stale() >= 1
        _, after = self._grant(backend, key)
        assert after > before

    def test_only_the_live_holder_gets_a_fence(
        self, fencing_backend: BaseBackend, key: str
    ) -> None:
        backend = fencing_backend
        token = new_token()
        assert backend.fence(key, token) is None  # nobody holds the key
        assert backend.acquire(key, token, ttl=timedelta(seconds=0.2), max_lifetime=LIFE)
        assert backend.fence(key, new_token()) is None  # not the holder
        time.sleep(0.3)
        assert backend.fence(key, token) is None  # expired
        other, fence = self._grant(backend, key)
        assert backend.release(key, other)
        assert backend.fence(key, other) is None  # released
        assert self._grant(backend, key)[1] > fence

    def test_a_holder_fencing_after_its_successor_gets_nothing(
        self, fencing_backend: BaseBackend, key: str
    ) -> None:
        backend = fencing_backend
        paused = new_token()  # acquired, then paused before asking for its fence
        assert backend.acquire(key, paused, ttl=timedelta(seconds=0.2), max_lifetime=LIFE)
        time.sleep(0.3)
        token, successor = self._grant(backend, key)
        assert backend.fence(key, paused) is None
        assert backend.release(key, token)
        assert self._grant(backend, key)[1] > successor

    def test_stale_holders_fenced_write_is_rejected(
        self,
        contract_backend: ContractBackend,
        fencing_backend: BaseBackend,
        service: TaskLockService,
        key: str,
    ) -> None:
        recipe = cross_process_recipe(contract_backend)
        with _fenced_holder(recipe, key) as (proc, conn, resource, stale_fence):
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGSTOP)  # paused past its ttl: GC, swap, a stopped VM
            try:
                with service.lock(key, fencing=True, wait=_TTL + 10) as lock:
                    assert lock.fence is not None
                    assert lock.fence > stale_fence
                    assert fenced_write(resource, lock.fence, "fresh")
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            conn.send("write")
            assert conn.poll(30), "the stale holder never answered"
            assert conn.recv() == ("wrote", False)
            with open(resource) as written:
                assert written.read() == f"{lock.fence} fresh"

    def test_successor_of_a_killed_holder_gets_a_greater_fence(
        self,
        contract_backend: ContractBackend,
        fencing_backend: BaseBackend,
        service: TaskLockService,
        key: str,
    ) -> None:
        recipe = cross_process_recipe(contract_backend)
        with _fenced_holder(recipe, key) as (proc, _conn, _resource, dead_fence):
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(5)
            result = service.run_exclusive(key, lambda: None, fencing=True, wait=_TTL + 10)
        assert result.acquired
        assert result.fence is not None
        assert result.fence > dead_fence


@contextmanager
def _fenced_holder(
    recipe: BackendRecipe, key: str
) -> Iterator[tuple[BaseProcess, Connection, str, int]]:
    """A holder of ``key`` in another process, with its fence and a fresh resource file."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    with tempfile.TemporaryDirectory() as tmp:
        resource = os.path.join(tmp, "resource")
        proc = ctx.Process(
            target=hold_fenced, args=(recipe, key, _TTL, _INTERVAL, resource, theirs)
        )
        proc.start()
        try:
            assert ours.poll(60), "the holder never reported"
            kind, fence = ours.recv()
            assert kind == "fenced"
            assert isinstance(fence, int)
            yield proc, ours, resource, fence
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
