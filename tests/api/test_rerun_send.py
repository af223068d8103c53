"""``on_locked="rerun"`` in a task: the latest skipped call is sent once more by the holder.

A sender of a test's own stands in for a task framework (the frameworks'
own send with real workers in tests/frameworks, ``twenty_triggers``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_tasklock import TaskLockService, exclusive
from django_tasklock.api import rerun
from django_tasklock.api.rerun import Sender
from django_tasklock.backends.memory import MemoryBackend

PATIENCE = 120


class StandIn:
    """A framework whose task runs ``running`` now (None: none), and which records sends."""

    def __init__(self) -> None:
        self.running: dict[str, Any] | None = None
        self.sent: list[dict[str, Any]] = []
        self.fail = False

    def describe(self) -> dict[str, Any] | None:
        return self.running

    def send(self, call: dict[str, Any]) -> None:
        if self.fail:
            raise ConnectionError("the broker is gone")
        self.sent.append(call)


@pytest.fixture
def framework() -> Iterator[StandIn]:
    stand_in = StandIn()
    rerun.register_sender(Sender("Stand-in", stand_in.describe, stand_in.send))
    yield stand_in
    del rerun._senders["Stand-in"]


def holding(service: TaskLockService, key: str, runs: list[Any]) -> tuple[Any, Any, Any]:
    """A holder thread running ``rebuild(0)`` until the test sets the event it returns."""
    started, go = threading.Event(), threading.Event()

    @exclusive(key, on_locked="rerun", service=service)
    def rebuild(n: int) -> int:
        runs.append(n)
        if n == 0:
            started.set()
            assert go.wait(PATIENCE)
        return n

    thread = threading.Thread(target=rebuild, args=(0,))
    thread.start()
    assert started.wait(PATIENCE)
    return rebuild, go, thread


def test_the_latest_skipped_task_call_is_sent_once_more_not_run_by_the_holder(
    framework: StandIn, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = MemoryBackend()
    service, runs = TaskLockService(backend), list[int]()
    rebuild, go, thread = holding(service, key, runs)
    try:
        for n in (1, 2, 3):
            framework.running = {"task": "rebuild", "args": [n], "kwargs": {}}
            assert rebuild(n) is None
        assert json.loads(backend._marks[key].payload or "") == {
            "framework": "Stand-in",
            "task": "rebuild",
            "args": [3],
            "kwargs": {},
        }
        framework.running = None  # the holder runs in no task of the stand-in
    finally:
        with caplog.at_level(logging.INFO, "django_tasklock"):
            go.set()
            thread.join(PATIENCE)
    assert runs == [0], "the holder ran its own work again"
    assert framework.sent == [
        {"framework": "Stand-in", "task": "rebuild", "args": [3], "kwargs": {}}
    ]
    assert "as the Stand-in task rebuild with the latest skipped call's arguments" in caplog.text
    assert backend.rerun_marks(key) == {}
    assert backend.peek(key) is None, "sent after the key was let go"


def test_a_call_whose_arguments_json_cannot_hold_is_run_by_the_holder(
    framework: StandIn, key: str
) -> None:
    service, runs = TaskLockService(MemoryBackend()), list[int]()
    rebuild, go, thread = holding(service, key, runs)
    try:
        framework.running = {"task": "rebuild", "args": [object()], "kwargs": {}}
        assert rebuild(1) is None
        framework.running = None
    finally:
        go.set()
        thread.join(PATIENCE)
    assert runs == [0, 0]
    assert framework.sent == []


def test_a_send_that_fails_is_logged_and_the_holder_returns(
    framework: StandIn, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    service, runs = TaskLockService(MemoryBackend()), list[int]()
    rebuild, go, thread = holding(service, key, runs)
    try:
        framework.running = {"task": "rebuild", "args": [1], "kwargs": {}}
        assert rebuild(1) is None
        framework.running = None
        framework.fail = True
    finally:
        with caplog.at_level(logging.ERROR, "django_tasklock"):
            go.set()
            thread.join(PATIENCE)
    assert not thread.is_alive()
    assert runs == [0]
    assert "once more failed: it will not run again until the key is marked again" in caplog.text
