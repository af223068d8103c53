"""Contract cases: mutual exclusion and the token.

docs/guarantees.md, "What you can rely on", items 1-2.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import socket
import threading
import time
from datetime import timedelta

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import BaseBackend
from django_tasklock.testing.support import (
    LIFE,
    ContractBackend,
    cross_process_recipe,
)
from django_tasklock.testing.workers import contend


class ExclusionCases:
    """Threads and processes racing for a key; tokens bind refresh and release."""

    # -- 1. mutual exclusion ------------------------------------------------

    def test_second_acquire_of_a_held_key_is_refused(self, backend: BaseBackend, key: str) -> None:
        ttl, life = timedelta(seconds=30), timedelta(hours=1)
        assert backend.acquire(key, new_token(), ttl=ttl, max_lifetime=life)
        assert not backend.acquire(key, new_token(), ttl=ttl, max_lifetime=life)
        assert backend.acquire(key + "-other", new_token(), ttl=ttl, max_lifetime=life)

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
                service.backend.close()  # the thread's connections die with it

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == [False] * 7 + [True]

    def test_processes_racing_never_overlap(
        self, contract_backend: ContractBackend, key: str
    ) -> None:
        recipe = cross_process_recipe(contract_backend)
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
        self, backend: BaseBackend, key: str
    ) -> None:
        token = new_token()
        assert backend.acquire(key, token, ttl=timedelta(seconds=30), max_lifetime=LIFE)
        held = backend.peek(key)
        assert held is not None
        assert (held.holder.host, held.holder.pid) == (socket.gethostname(), os.getpid())
        assert token.split(":")[-1] not in str(held)
        assert len({new_token() for _ in range(100)}) == 100

    def test_refresh_and_release_are_bound_to_the_token(
        self, backend: BaseBackend, key: str
    ) -> None:
        ttl, life = timedelta(seconds=30), timedelta(hours=1)
        token, intruder = new_token(), new_token()
        assert backend.acquire(key, token, ttl=ttl, max_lifetime=life)
        assert not backend.refresh(key, intruder, ttl=ttl, max_lifetime=life)
        assert not backend.release(key, intruder)
        assert backend.peek(key) is not None
        assert backend.refresh(key, token, ttl=ttl, max_lifetime=life)
        assert backend.release(key, token)
        assert backend.peek(key) is None
        assert not backend.release(key, token)
