"""SIGTERM of a plain process holding a lock (a management command here, run for real).

Without a handler (Python's default), the process ends at once, no ``finally``
runs, and its lease stays: the next acquisition on this machine proves the
process gone and takes the key over (before, it was held for the whole ttl,
15 min here), and ``tasklock list`` says the holder is gone. With
``release_on_sigterm()``, SIGTERM unwinds the command: its ``finally`` runs and
the lock is released on the way out, for a taker anywhere.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_tasklock import release_on_sigterm
from django_tasklock.api.service import TaskLockService
from django_tasklock.testing.cases_dead import AT_ONCE
from tests.jobs import PATIENCE, wait_for
from tests.support import processes, services

pytestmark = pytest.mark.databases

SLACK = 1.0


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The command's environment for a lock store, with this process's settings to match."""
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.jobs.commands_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
    }
    if request.param == "sqlite":
        yield env
        return
    if not settings.REDIS_URL:
        pytest.skip(services.missing.get("redis", "Redis not available"))
    env |= {"TASKLOCK_TEST_LOCK_STORE": "redis", services.REDIS_ENV: settings.REDIS_URL}
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL=settings.REDIS_URL):
        yield env


def hold_lock(key: str, tmp_path: Path, env: dict[str, str], *options: str) -> Any:
    return processes.worker(
        ["django", "hold_lock", key, str(tmp_path), *options], env, tmp_path / "command.log"
    )


def listed(key: str, *options: str) -> str:
    out = StringIO()
    call_command("tasklock", "list", "--prefix", key, *options, stdout=out)
    return out.getvalue()


def test_a_command_stopped_by_sigterm_frees_its_key_at_once_on_this_machine(
    store: dict[str, str], key: str, tmp_path: Path
) -> None:
    with hold_lock(key, tmp_path, store) as command:
        wait_for(tmp_path / "holding")
        assert json.loads(listed(key, "--json"))[0]["holder_gone"] is False
        command.send_signal(signal.SIGTERM)
        assert command.wait(PATIENCE) == -signal.SIGTERM
        stopped = time.monotonic()
        assert not (tmp_path / "finally").exists()  # Python's default: nothing unwinds
        (seen,) = json.loads(listed(key, "--json"))
        assert (seen["pid"], seen["holder_gone"]) == (command.pid, True)
        assert "(holder process gone)" in listed(key)
        with TaskLockService().lock(key, ttl=60):  # taken over at once
            taken = time.monotonic()
    assert taken - stopped <= AT_ONCE + SLACK


def test_release_on_sigterm_releases_on_the_way_out(
    store: dict[str, str], key: str, tmp_path: Path
) -> None:
    with hold_lock(key, tmp_path, store, "--release-on-sigterm") as command:
        wait_for(tmp_path / "holding")
        command.send_signal(signal.SIGTERM)
        assert command.wait(PATIENCE) == 128 + signal.SIGTERM
    assert (tmp_path / "finally").read_text() == "ran"
    assert TaskLockService().backend.peek(key) is None  # released, not taken over


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_release_on_sigterm_never_replaces_a_handler(sigterm_restored: None) -> None:
    def theirs(signum: int, frame: Any) -> None: ...

    signal.signal(signal.SIGTERM, theirs)
    assert not release_on_sigterm()
    assert signal.getsignal(signal.SIGTERM) is theirs
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    assert not release_on_sigterm()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert release_on_sigterm()
    assert release_on_sigterm()  # installed already


def test_release_on_sigterm_from_another_thread_is_refused(sigterm_restored: None) -> None:
    raised: list[BaseException] = []

    def call() -> None:
        try:
            release_on_sigterm()
        except RuntimeError as exc:
            raised.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert "main thread" in str(raised[0])
