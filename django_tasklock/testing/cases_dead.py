"""Contract cases: a dead holder frees its key at once; a live one never does.

docs/guarantees.md, "What you can rely on", item 12. A backend with the
capability ``dead_holders`` takes over, in ``acquire``, a lease whose holder
is provably gone (a process of this machine that no longer runs), and ends
it in ``reap_dead_holders``; one without it is only held to the cases that
say what must never be taken over. Cases that need a proof of death skip
where this machine offers none (no ``/proc``).
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import BaseBackend, lease_id
from django_tasklock.holders import CLAIM_MARK
from django_tasklock.processes import this_machine
from django_tasklock.testing.support import (
    LIFE,
    LONG,
    ContractBackend,
    cross_process_recipe,
    wait_until,
)
from django_tasklock.testing.workers import hold_until_killed

#: The bound on freeing a dead holder's key for a taker of its machine.
AT_ONCE = 2.0
#: A lease far longer than any case: only a proof of death frees it in time.
LONG_TTL = 900.0


def proofs_here() -> str:
    """This machine's name in tokens, or a skip: without ``/proc`` nothing is proven."""
    machine = this_machine()
    if machine is None:
        pytest.skip("no /proc here: no holder can be proven gone (the ttl decides)")
    return machine


def takes_over(backend: BaseBackend, name: str) -> None:
    """Skip unless ``backend`` claims the capability ``dead_holders``."""
    if not backend.capabilities.dead_holders:
        pytest.skip(f"{name}: capability dead_holders=False (dead holders' leases end by ttl)")


def token_of(pid: int, started: int | None, machine: str | None, *, claim: bool = False) -> str:
    """A token naming ``pid`` of ``machine``, started at ``started`` (no proof if None)."""
    proof = "" if machine is None or started is None else f"/{machine}.{started}"
    mark = CLAIM_MARK if claim else ""
    return f"{socket.gethostname()}:{pid}:{mark}{secrets.token_urlsafe(18)}{proof}"


def dead_token() -> str:
    """A token a process of this machine made and then exited: its holder is gone."""
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "from django_tasklock.leases.tokens import new_token; print(new_token())",
        ],
        capture_output=True,
        check=True,
        text=True,
        timeout=60,
    )
    return made.stdout.strip()


def own_start() -> int:
    """This process's start time, as its tokens carry it."""
    from django_tasklock.backends.base import Holder

    started = Holder.from_token(new_token()).started
    assert started is not None
    return started


class DeadHolderCases:
    """A dead holder's key is taken over at once and reaped; a live holder's never."""

    # -- taken over at once ----------------------------------------------------------

    @pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
    def test_a_killed_holder_frees_its_key_at_once_for_this_machine(
        self, contract_backend: ContractBackend, backend: BaseBackend, key: str, how: int
    ) -> None:
        recipe = cross_process_recipe(contract_backend)
        takes_over(backend, contract_backend.name)
        proofs_here()
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=hold_until_killed, args=(recipe, key, LONG_TTL, LONG_TTL / 3, theirs)
        )
        proc.start()
        try:
            assert ours.poll(60), "the holder never reported"
            assert ours.recv() == ("acquired", proc.pid)
            assert proc.pid is not None
            # Alive: never taken over, never reaped.
            assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
            assert key not in [held.key for held in backend.reap_dead_holders()]
            os.kill(proc.pid, how)
            killed = time.monotonic()
            # Not joined first: a zombie (exited, not yet reaped) is gone too.
            taken = wait_until(
                lambda: backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE),
                timeout=AT_ONCE + 10,
            )
        finally:
            proc.kill()
            proc.join(30)
        assert taken - killed <= AT_ONCE, f"taken over {taken - killed:.2f} s after the kill"

    def test_a_waiter_takes_the_key_once_its_holder_dies(
        self,
        contract_backend: ContractBackend,
        backend: BaseBackend,
        service: TaskLockService,
        key: str,
    ) -> None:
        """``wait=``: a holder that dies while others wait for it frees its key at once."""
        recipe = cross_process_recipe(contract_backend)
        takes_over(backend, contract_backend.name)
        proofs_here()
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=hold_until_killed, args=(recipe, key, LONG_TTL, LONG_TTL / 3, theirs)
        )
        proc.start()
        took: list[float] = []

        def wait_for_it() -> None:
            with service.lock(key, ttl=LONG, wait=60):
                took.append(time.monotonic())
            backend.close()

        waiter = threading.Thread(target=wait_for_it)
        try:
            assert ours.poll(60), "the holder never reported"
            assert ours.recv() == ("acquired", proc.pid)
            assert proc.pid is not None
            waiter.start()
            time.sleep(1.5)  # the waiter has looked, and waits
            assert not took
            os.kill(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            waiter.join(60)
        finally:
            proc.kill()
            proc.join(30)
        assert took, "the waiter never got the key"
        assert took[0] - killed <= AT_ONCE, f"taken {took[0] - killed:.2f} s after the kill"

    def test_a_dead_holders_lease_is_taken_over_bound_to_its_token(
        self, backend: BaseBackend, key: str, contract_backend: ContractBackend
    ) -> None:
        takes_over(backend, contract_backend.name)
        proofs_here()
        dead = dead_token()
        assert backend.acquire(key, dead, ttl=LONG, max_lifetime=LIFE)
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        held = backend.peek(key)
        assert held is not None
        assert held.lease == lease_id(token)
        # The dead token is nobody's now; ours, sent again, is still ours.
        assert not backend.refresh(key, dead, ttl=LONG, max_lifetime=LIFE)
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(key, token)

    def test_a_holder_whose_pid_is_another_process_now_is_gone(
        self, backend: BaseBackend, key: str, contract_backend: ContractBackend
    ) -> None:
        """Its pid was reused: the process there started at another time."""
        takes_over(backend, contract_backend.name)
        machine = proofs_here()
        reused = token_of(os.getpid(), own_start() + 1, machine)
        assert backend.acquire(key, reused, ttl=LONG, max_lifetime=LIFE)
        assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)

    def test_of_two_takers_of_a_dead_holders_key_one_wins(
        self, backend: BaseBackend, key: str, contract_backend: ContractBackend
    ) -> None:
        takes_over(backend, contract_backend.name)
        proofs_here()
        dead = dead_token()
        for round_ in range(5):
            name = f"{key}-{round_}"
            assert backend.acquire(name, dead, ttl=LONG, max_lifetime=LIFE)
            barrier = threading.Barrier(6)
            won: list[bool] = []
            takers = [
                threading.Thread(target=self._take, args=(backend, name, barrier, won))
                for _ in range(6)
            ]
            for thread in takers:
                thread.start()
            for thread in takers:
                thread.join(60)
            assert sorted(won) == [False] * 5 + [True], won

    @staticmethod
    def _take(backend: BaseBackend, key: str, barrier: threading.Barrier, won: list[bool]) -> None:
        token = new_token()
        barrier.wait(30)
        won.append(backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE))
        backend.close()

    # -- reaped -----------------------------------------------------------------------

    def test_reaping_ends_a_dead_holders_lease_and_nothing_else(
        self, backend: BaseBackend, key: str, contract_backend: ContractBackend
    ) -> None:
        takes_over(backend, contract_backend.name)
        machine = proofs_here()
        dead = dead_token()
        assert backend.acquire(key, dead, ttl=LONG, max_lifetime=LIFE)
        kept = {
            f"{key}-live": new_token(),
            f"{key}-elsewhere": token_of(os.getpid(), own_start() + 1, "x" * len(machine)),
            f"{key}-older": dead.rpartition("/")[0],
            f"{key}-claim": token_of(os.getpid(), own_start() + 1, machine, claim=True),
        }
        for name, token in kept.items():
            assert backend.acquire(name, token, ttl=LONG, max_lifetime=LIFE)
        ended = backend.reap_dead_holders()
        assert key in [held.key for held in ended]
        assert backend.peek(key) is None
        for name in kept:
            assert backend.peek(name) is not None, name
        assert not [held for held in ended if held.key in kept]

    def test_reaping_with_the_callers_leases_named_alive_still_ends_a_dead_holders(
        self, backend: BaseBackend, key: str, contract_backend: ContractBackend
    ) -> None:
        """``alive`` (the heartbeat's own leases) may be skipped: the others are looked at,
        and the named ones are left held."""
        takes_over(backend, contract_backend.name)
        proofs_here()
        ours = [f"{key}-ours-{n}" for n in range(3)]
        for name in ours:
            assert backend.acquire(name, new_token(), ttl=LONG, max_lifetime=LIFE)
        assert backend.acquire(key, dead_token(), ttl=LONG, max_lifetime=LIFE)
        ended = backend.reap_dead_holders(set(ours))
        assert [held.key for held in ended if held.key.startswith(key)] == [key]
        assert backend.peek(key) is None
        for name in ours:
            assert backend.peek(name) is not None, name

    # -- never taken over ---------------------------------------------------------------

    def test_holders_whose_death_cannot_be_proven_are_never_taken_over(
        self, backend: BaseBackend, key: str
    ) -> None:
        """Another machine (or container), an older version's token, a ``unique_on`` claim."""
        machine = this_machine() or "m" * 16
        dead = dead_token()
        held = {
            f"{key}-elsewhere": token_of(os.getpid(), 1, "x" * len(machine)),
            f"{key}-older": dead.rpartition("/")[0] if "/" in dead else dead,
            f"{key}-claim": token_of(os.getpid(), 1, machine, claim=True),
            f"{key}-live": new_token(),
        }
        for name, token in held.items():
            assert backend.acquire(name, token, ttl=LONG, max_lifetime=LIFE)
        backend.reap_dead_holders()
        for name in held:
            assert not backend.acquire(name, new_token(), ttl=LONG, max_lifetime=LIFE), name
            assert backend.peek(name) is not None, name

    def test_a_min_hold_outlives_its_dead_holder(self, backend: BaseBackend, key: str) -> None:
        """A release with ``min_hold`` keeps the key held after its process ends."""
        dead = dead_token()
        assert backend.acquire(key, dead, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(key, dead, min_hold=timedelta(seconds=30))
        backend.reap_dead_holders()
        assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        assert backend.peek(key) is not None
