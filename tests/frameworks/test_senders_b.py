"""The Dramatiq and Huey senders of ``on_locked="rerun"`` (``contrib.reruns``), in this process.

Outside a task, neither describes a call; inside one (an in-process worker,
a Huey instance's ``execute``), the call described is sent again as the same
call. With real workers: test_dramatiq.py and test_huey.py (``twenty_triggers``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from django_tasklock.api import rerun
from django_tasklock.contrib import reruns
from tests.support import processes
from tests.support.dramatiq_stub import stub_broker


def test_the_dramatiq_and_huey_senders_are_installed_by_the_apps_ready() -> None:
    assert {"Dramatiq", "Huey"} <= set(rerun._senders)
    assert rerun._senders["Dramatiq"].send is reruns.dramatiq_send
    assert rerun._senders["Huey"].describe is reruns.huey_describe


# -- Dramatiq -----------------------------------------------------------------


def test_outside_a_message_dramatiq_describes_no_call() -> None:
    processes.require_module("dramatiq")
    import dramatiq.middleware.current_message  # noqa: F401 - looked for in sys.modules

    import django_tasklock.contrib.dramatiq  # noqa: F401

    assert reruns.dramatiq_describe() is None


def test_without_dramatiq_imported_none_is_described(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "dramatiq", raising=False)
    assert reruns.dramatiq_describe() is None


@pytest.fixture(params=["TaskLock", "CurrentMessage"])
def dramatiq_broker(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A stub broker with our TaskLock or Dramatiq's CurrentMessage (the running message
    known by either), the global one, and a worker of one thread in this process."""
    processes.require_module("dramatiq")
    from dramatiq.middleware import CurrentMessage

    from django_tasklock.contrib.dramatiq import TaskLock

    middleware = TaskLock() if request.param == "TaskLock" else CurrentMessage()
    with stub_broker([middleware]) as broker:
        yield broker


def test_a_dramatiq_message_described_is_sent_again_as_the_same_call(
    dramatiq_broker: Any,
) -> None:
    import dramatiq

    seen: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []

    @dramatiq.actor(broker=dramatiq_broker, actor_name="senders_b_rebuild", queue_name="rebuilds")
    def rebuild(day: str, *, full: bool = False) -> None:
        seen.append(((day,), {"full": full}, reruns.dramatiq_describe()))

    rebuild.send_with_options(args=("monday",), kwargs={"full": True}, max_retries=3)
    dramatiq_broker.join("rebuilds", timeout=30_000)
    ((_, _, call),) = seen
    assert call == {
        "task": "senders_b_rebuild",
        "queue": "rebuilds",
        "args": ["monday"],
        "kwargs": {"full": True},
        "options": {"max_retries": 3},  # not the broker's ids, nor a retries count
    }
    mark = json.loads(json.dumps({"framework": "Dramatiq", **call}))  # as the mark holds it
    reruns.dramatiq_send(mark)
    dramatiq_broker.join("rebuilds", timeout=30_000)
    assert seen[1][:2] == (("monday",), {"full": True})
    assert seen[1][2] == call


def test_a_dramatiq_call_from_another_queue_goes_back_there(dramatiq_broker: Any) -> None:
    import dramatiq

    ran: list[str] = []

    @dramatiq.actor(broker=dramatiq_broker, actor_name="senders_b_elsewhere")
    def elsewhere(day: str) -> None:
        ran.append(day)

    dramatiq_broker.declare_queue("other")
    reruns.dramatiq_send(
        {"task": "senders_b_elsewhere", "queue": "other", "args": ["sunday"], "kwargs": {}}
    )
    message = dramatiq_broker.queues["other"].get(timeout=5)
    assert json.loads(message)["args"] == ["sunday"]
    assert ran == []


def test_a_dramatiq_actor_unknown_to_the_holder_cannot_be_sent(dramatiq_broker: Any) -> None:
    import dramatiq

    with pytest.raises(dramatiq.errors.ActorNotFound):
        reruns.dramatiq_send({"task": "nobody", "args": [], "kwargs": {}})


def test_without_a_global_dramatiq_broker_nothing_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    processes.require_module("dramatiq")
    import dramatiq.broker

    monkeypatch.setattr(dramatiq.broker, "global_broker", None)
    with pytest.raises(RuntimeError, match="no Dramatiq broker"):
        reruns.dramatiq_send({"task": "rebuild", "args": [], "kwargs": {}})


# -- Huey ---------------------------------------------------------------------


@pytest.fixture
def huey() -> Any:
    """A memory Huey whose tasks ``contrib.huey.track_tasks`` knows."""
    processes.require_module("huey")
    from huey import MemoryHuey

    from django_tasklock.contrib.huey import track_tasks

    instance = MemoryHuey("tasklock-senders-b")
    track_tasks(instance)
    return instance


def test_outside_a_task_huey_describes_no_call(huey: Any) -> None:
    assert reruns.huey_describe() is None


def test_a_huey_task_described_is_sent_again_as_the_same_call(huey: Any) -> None:
    seen: list[Any] = []

    @huey.task(context=True, name="senders_b_rebuild", priority=5)  # type: ignore[untyped-decorator]
    def rebuild(day: str, full: bool = False, task: Any = None) -> None:
        call = reruns.huey_describe()
        seen.append(((day,), {"full": full}, call))
        if call is not None and len(seen) == 1:  # sent from within a task: on its own Huey
            reruns.huey_send(json.loads(json.dumps({"framework": "Huey", **call})))

    rebuild("monday", full=True)
    huey.execute(huey.dequeue())
    ((_, _, call),) = seen
    assert call == {
        "task": f"{__name__}.senders_b_rebuild",
        "huey": "tasklock-senders-b",
        "args": ["monday"],
        "kwargs": {"full": True},  # not the task injected by context=True
        "priority": 5,
    }
    again = huey.dequeue()
    assert again is not None
    huey.execute(again)
    assert seen[1] == (("monday",), {"full": True}, call)
    assert huey.dequeue() is None


def test_a_huey_task_is_sent_on_djhueys_huey_outside_a_task(
    huey: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    @huey.task()  # type: ignore[untyped-decorator]
    def tidy(day: str) -> str:
        return day

    name = huey._registry.task_to_string(tidy.task_class)
    call = {"task": name, "huey": huey.name, "args": ["sunday"], "kwargs": {}}
    monkeypatch.setitem(sys.modules, "huey.contrib.djhuey", types.SimpleNamespace(HUEY=huey))
    reruns.huey_send(call)
    assert huey.dequeue().args == ("sunday",)
    with pytest.raises(RuntimeError, match="'another'"):
        reruns.huey_send({**call, "huey": "another"})
    monkeypatch.delitem(sys.modules, "huey.contrib.djhuey")
    with pytest.raises(RuntimeError, match="no Huey instance"):
        reruns.huey_send(call)


def test_huey_outside_a_task_without_contrib_describes_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "django_tasklock.contrib.huey", raising=False)
    assert reruns.huey_describe() is None
