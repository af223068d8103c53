"""The thread each signal is documented to come from is the thread it comes from.

Receivers need to know (a receiver on the heartbeat's thread would stall
every refresh; one on the notifier's must close the database connections it
opens). The ``signals`` module says it next to each signal; these tests send
them for real and compare.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_tasklock import lock_lost, lock_stalled, signals
from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.memory import MemoryBackend

NOTIFIER = "django-tasklock-notifier"


def _documented(name: str) -> str:
    """The ``#:`` comment above ``name = Signal()`` in ``signals``, joined."""
    lines = inspect.getsource(signals).splitlines()
    end = lines.index(f"{name} = Signal()")
    start = end
    while start > 0 and lines[start - 1].startswith("#:"):
        start -= 1
    return " ".join(line.removeprefix("#:").strip() for line in lines[start:end])


@pytest.fixture
def threads() -> Iterator[dict[str, list[str]]]:
    seen: dict[str, list[str]] = {"lock_stalled": [], "lock_lost": []}

    def stalled(sender: object, **kwargs: Any) -> None:
        seen["lock_stalled"].append(threading.current_thread().name)

    def lost(sender: object, **kwargs: Any) -> None:
        seen["lock_lost"].append(threading.current_thread().name)

    lock_stalled.connect(stalled, weak=False)
    lock_lost.connect(lost, weak=False)
    yield seen
    lock_stalled.disconnect(stalled)
    lock_lost.disconnect(lost)


def _wait(seen: list[str]) -> None:
    end = time.monotonic() + 10
    while not seen and time.monotonic() < end:
        time.sleep(0.01)


def test_lock_stalled_comes_from_the_thread_its_docstring_names(
    threads: dict[str, list[str]],
) -> None:
    service = TaskLockService(MemoryBackend())
    with service.lock("stalled", ttl=30, refresh_interval=0.1, progress_timeout=0.2):
        _wait(threads["lock_stalled"])
    assert threads["lock_stalled"] == [NOTIFIER]
    documented = _documented("lock_stalled")
    assert "from the notifier thread" in documented, documented
    assert "from the heartbeat thread" not in documented, documented


def test_a_loss_the_heartbeat_finds_is_sent_from_the_notifier_thread(
    threads: dict[str, list[str]],
) -> None:
    backend = MemoryBackend()
    with TaskLockService(backend).lock("lost", ttl=30, refresh_interval=0.1):
        assert backend.force_release("lost")
        _wait(threads["lock_lost"])
    assert threads["lock_lost"] == [NOTIFIER]
    assert "never from the heartbeat or the deadline watcher" in (signals.__doc__ or "")
