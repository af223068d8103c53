"""Dead holders with real processes and real pid namespaces: what is proven, and by whom.

A holder is proven gone only by a process that sees the same pids: one in
another pid namespace (``unshare --pid --fork --mount-proc``, the way a
container gets its own) is never taken over from here, nor can it take over
a holder of ours; a holder it cannot prove gone frees its key for it when
the heartbeat of a process here reaps it. A pid reused by another process is
reused for real, inside a namespace of its own (``ns_last_pid``).

Needs ``unshare`` (util-linux) and root or unprivileged user namespaces;
skipped without them, except under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.leases.reaping import REAP_INTERVAL
from django_tasklock.testing import ContractBackend
from django_tasklock.testing.cases_dead import AT_ONCE
from tests.support import services
from tests.support.dead_workers import heard
from tests.support.processes import ROOT

LONG, LIFE = timedelta(minutes=15), timedelta(hours=1)
#: On a loaded two-core machine, a process's start and a storage's answer take time.
SLACK = 3.0


@functools.lru_cache(maxsize=1)
def _unshare() -> tuple[str, ...] | str:
    """The command that runs a process in a pid namespace of its own, or why there is none."""
    if shutil.which("unshare") is None:
        return "unshare is not installed (util-linux)"
    pid_namespace: tuple[str, ...] = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
    command = pid_namespace
    if os.geteuid() != 0:  # root in a user namespace of its own, where the kernel allows it
        command = ("unshare", "--map-root-user", *pid_namespace[1:])
    probe = subprocess.run([*command, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"{' '.join(command)} fails here: {probe.stderr.strip()}"
    return command


def in_namespace() -> tuple[str, ...]:
    command = _unshare()
    if isinstance(command, str):
        if services.IN_CI:
            pytest.fail(f"CI=true and {command}")
        pytest.skip(command)
    return command


def recipe_of(backend: ContractBackend) -> dict[str, Any]:
    if backend.recipe is None:
        pytest.skip(f"{backend.name}: one process only")
    return dataclasses.asdict(backend.recipe)


@contextlib.contextmanager
def worker(spec: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[subprocess.Popen[str]]:
    """``tests.support.dead_workers`` with ``spec`` (in a pid namespace with ``prefix``)."""
    process = subprocess.Popen(
        [*prefix, sys.executable, "-m", "tests.support.dead_workers", json.dumps(spec)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # killed with everything it started
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(60)
        assert process.stdout is not None
        process.stdout.close()


def kill(process: subprocess.Popen[str]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(60)


def test_a_holder_in_another_pid_namespace_is_never_taken_over(
    any_backend: ContractBackend, key: str
) -> None:
    """Its pid is 1 there; here pid 1 is another process, started at another time."""
    spec = {"mode": "hold", "recipe": recipe_of(any_backend), "key": key}
    backend = any_backend.backend
    with worker(spec, in_namespace()) as holder:
        assert heard(holder)["acquired"] == 1
        assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        assert key not in [held.key for held in backend.reap_dead_holders()]
        kill(holder)
    # Gone now, but nobody here can prove it: the ttl decides.
    assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
    assert key not in [held.key for held in backend.reap_dead_holders()]
    assert backend.peek(key) is not None


def test_a_taker_that_only_sees_the_storage_gets_the_key_once_it_is_reaped(
    any_backend: ContractBackend, key: str
) -> None:
    """The holder is killed; the taker, in a pid namespace of its own, cannot prove it
    gone; this process, which holds a lease (so its heartbeat reaps), frees the key."""
    recipe = recipe_of(any_backend)
    service = TaskLockService(any_backend.backend)
    with (
        service.lock(f"{key}-reaper", ttl=60),
        worker({"mode": "hold", "recipe": recipe, "key": key}) as holder,
    ):
        assert heard(holder)["acquired"] == holder.pid
        take = {"mode": "take", "recipe": recipe, "key": key, "timeout": 120}
        with worker(take, in_namespace()) as taker:
            time.sleep(1)  # the taker tries, and is refused, meanwhile
            kill(holder)
            killed = time.time()
            taken_at = heard(taker)["taken_at"]
    assert taken_at is not None, "the taker never got the key"
    assert killed < taken_at <= killed + AT_ONCE + REAP_INTERVAL + SLACK, taken_at - killed


def test_a_pid_reused_by_another_process(any_backend: ContractBackend, key: str) -> None:
    """A holder killed, its pid given to the next process: the dead holder's key is
    taken over at once, and the process that now has its pid (a holder too) never is."""
    spec = {"mode": "reuse", "recipe": recipe_of(any_backend), "key": key}
    with worker(spec, in_namespace()) as run:
        seen = heard(run)
    assert seen["took_a"], seen
    assert not seen["took_b"], seen
    assert f"{key}-b" not in seen["reaped"], seen
    assert seen["b_holds"], seen
