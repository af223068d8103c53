"""The ``exclusive`` actor option (``django_tasklock.contrib.dramatiq.TaskLock``) on real workers.

``dramatiq django_dramatiq.setup tests.jobs.dramatiq_actors --processes 2
--threads 1`` (what django-dramatiq's ``rundramatiq`` runs) serves a queue
on Redis in a namespace of this run's own; the locks are in the test's
SQLite database file. The test sends messages straight to the broker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.jobs import await_lines, wait_for
from tests.support import framework_runs, processes, rerun_runs
from tests.support.dramatiq_stub import stub_broker as global_stub_broker

RUN = uuid.uuid4().hex[:8]
Send = Callable[..., None]


@pytest.fixture(scope="module")
def send(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Send]:
    """``send(actor_name, *args)``: a message to two ``dramatiq`` worker processes."""
    processes.require_module("dramatiq")
    processes.require_module("django_dramatiq")
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    url, namespace, queue = processes.redis_url(), f"tasklock-tests-{RUN}", f"tasklock-tests-{RUN}"
    broker = RedisBroker(url=url, namespace=namespace, middleware=[])  # type: ignore[no-untyped-call]
    broker.declare_queue(queue)

    def send(actor_name: str, *args: Any) -> None:
        broker.enqueue(
            dramatiq.Message(
                queue_name=queue, actor_name=actor_name, args=args, kwargs={}, options={}
            )
        )

    env = {
        "DJANGO_SETTINGS_MODULE": "tests.jobs.dramatiq_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_REDIS_URL": url,
        "TASKLOCK_TEST_DRAMATIQ_NAMESPACE": namespace,
        "TASKLOCK_TEST_DRAMATIQ_QUEUE": queue,
        # One message at a time per worker: one that holds a key does not sit on the next.
        "dramatiq_queue_prefetch": "1",
    }
    args = [
        "dramatiq", "django_dramatiq.setup", "tests.jobs.dramatiq_actors",
        "--processes=2", "--threads=1", "--worker-shutdown-timeout=5000",
    ]  # fmt: skip
    started = tmp_path_factory.mktemp("dramatiq")
    try:
        with processes.worker(args, env, started / "worker.log"):
            send("ping", str(started))
            wait_for(started / "pong")
            yield send
    finally:
        for stored in broker.client.scan_iter(f"{namespace}:*"):
            broker.client.delete(stored)
        broker.close()


@pytest.mark.databases  # the locks: the test's SQLite file
def test_a_message_whose_key_is_held_is_skipped_by_dramatiq(send: Send, tmp_path: Path) -> None:
    key = f"{RUN}-same"
    send("hold_key", key, "first", str(tmp_path))
    wait_for(tmp_path / "first.holding")
    send("hold_key", key, "second", str(tmp_path))
    # Dramatiq's after_skip_message hook saw it (tests.jobs.dramatiq_skips).
    skipped = framework_runs.await_runs(tmp_path, 1).skipped_by
    assert len(skipped) == 1
    assert not (tmp_path / "second.holding").exists()
    (tmp_path / "first.release").touch()


@pytest.mark.databases  # the locks: the test's SQLite file
def test_when_held_retry_runs_the_message_again_once_the_key_is_free(
    send: Send, tmp_path: Path
) -> None:
    key = f"{RUN}-retry"
    send("hold_key", key, "first", str(tmp_path))
    wait_for(tmp_path / "first.holding")
    send("hold_key_or_retry", key, "second", str(tmp_path))
    # Retried every 100-300 ms by the Retries middleware, never run while held.
    with pytest.raises(TimeoutError):
        wait_for(tmp_path / "second.holding", timeout=1.5)
    (tmp_path / "first.release").touch()
    wait_for(tmp_path / "second.holding")
    (tmp_path / "second.release").touch()
    assert not list(tmp_path.glob("*.skipped"))


@pytest.mark.databases  # the locks: the test's SQLite file
def test_on_locked_retry_has_dramatiq_retry_the_message_until_the_key_is_free(
    send: Send, tmp_path: Path
) -> None:
    """The core's ``@exclusive(..., on_locked="retry")`` in an actor: the message
    (known by the TaskLock middleware; no CurrentMessage on this broker) is
    retried with ``dramatiq.Retry(delay=...)`` while the key is held, then runs once."""
    key = f"{RUN}-core-retry"
    send("hold_key", key, "first", str(tmp_path))
    wait_for(tmp_path / "first.holding")
    send("retry_when_held", key, "second", str(tmp_path))
    tries = tmp_path / "second.tries"
    await_lines(tries, 2)  # retried at least once
    assert not (tmp_path / "second.runs").exists()
    released = time.time()
    (tmp_path / "first.release").touch()
    wait_for(tmp_path / "second.runs")
    time.sleep(1)  # room for a second run, which must not come
    (ran,) = (tmp_path / "second.runs").read_text().split()
    assert float(ran) >= released
    assert not list(tmp_path.glob("*.skipped"))


@pytest.mark.databases  # the locks: the test's SQLite file
def test_messages_of_different_keys_run_at_the_same_time(send: Send, tmp_path: Path) -> None:
    send("hold_key", f"{RUN}-one", "one", str(tmp_path))
    send("hold_key", f"{RUN}-two", "two", str(tmp_path))
    # Both hold their keys at once: neither waited for the other.
    wait_for(tmp_path / "one.holding")
    wait_for(tmp_path / "two.holding")
    (tmp_path / "one.release").touch()
    (tmp_path / "two.release").touch()


@pytest.mark.databases  # the locks: the test's SQLite file
def test_fifty_overlapping_messages_of_one_key_on_two_workers_never_overlap(
    send: Send, tmp_path: Path
) -> None:
    for _ in range(50):
        send("record", f"{RUN}-volume", 0.05, str(tmp_path))
    framework_runs.assert_one_at_a_time(framework_runs.await_runs(tmp_path, 50), 50)


@pytest.mark.databases  # the locks: the test's SQLite file
def test_two_processes_twenty_triggers_during_a_run_make_exactly_one_more_run(
    send: Send, tmp_path: Path
) -> None:
    """The holder takes one worker process (one thread); the other skips the 20. The
    messages are known by the TaskLock middleware (dramatiq_settings): the holder sends
    the last skipped message's call once more, to any worker."""
    key = f"{RUN}-rerun-{tmp_path.name}"
    rerun_runs.twenty_triggers(
        lambda n: send("rebuild", key, str(tmp_path), n), tmp_path, sent_again=True
    )


@pytest.fixture
def stub_broker() -> Any:
    """A broker in this process with the TaskLock middleware, for declaring actors."""
    processes.require_module("dramatiq")
    from dramatiq.brokers.stub import StubBroker

    from django_tasklock.contrib.dramatiq import TaskLock

    broker = StubBroker()
    broker.add_middleware(TaskLock())
    yield broker
    broker.close()


def rebuild(day: str) -> str:
    return f"rebuilt {day}"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"exclusive": 42}, "exclusive must be"),
        ({"exclusive": "rollups:{month}"}, "month"),
        ({"exclusive": "rollups:{day}", "when_held": "later"}, "when_held must be"),
        ({"exclusive": "rollups:{day}", "exclusive_options": [("ttl", 5)]}, "exclusive_options"),
        ({"exclusive": "rollups:{day}", "exclusive_options": {"ttl_seconds": 5}}, "ttl_seconds"),
        ({"exclusive": "rollups:{day}", "exclusive_options": {"on_locked": print}}, "when_held="),
        ({"when_held": "retry"}, "needs exclusive="),
        ({"exclusive_options": {"ttl": 5}}, "needs exclusive="),
    ],
)
def test_bad_options_are_refused_when_the_actor_is_declared(
    stub_broker: Any, options: dict[str, Any], named: str
) -> None:
    import dramatiq

    from django_tasklock.contrib.dramatiq import ExclusiveOptionError

    with pytest.raises(ExclusiveOptionError, match=named) as raised:
        dramatiq.actor(broker=stub_broker, **options)(rebuild)
    assert "'rebuild'" in str(raised.value)  # the actor's name
    assert isinstance(raised.value, ValueError)
    assert "rebuild" not in stub_broker.actors


def test_without_the_middleware_dramatiq_refuses_the_option() -> None:
    processes.require_module("dramatiq")
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    with pytest.raises(ValueError, match="exclusive"):
        dramatiq.actor(broker=StubBroker(), exclusive="rollups:{day}")(rebuild)


@pytest.mark.databases
@pytest.mark.parametrize("when_held", ["skip", "retry"])
def test_a_direct_call_while_held_raises_what_the_worker_acts_on(
    stub_broker: Any, when_held: str
) -> None:
    import dramatiq
    from dramatiq.middleware import SkipMessage

    from django_tasklock import TaskLockService

    actor = dramatiq.actor(broker=stub_broker, exclusive=f"{RUN}:{{day}}", when_held=when_held)(
        rebuild
    )
    assert actor("monday") == "rebuilt monday"
    raised = dramatiq.Retry if when_held == "retry" else SkipMessage
    with TaskLockService().lock(f"{RUN}:monday", ttl=60), pytest.raises(raised, match="held"):
        actor("monday")


@pytest.mark.databases
def test_exclusive_true_locks_the_functions_dotted_name(stub_broker: Any) -> None:
    import dramatiq
    from dramatiq.middleware import SkipMessage

    from django_tasklock import TaskLockService

    actor = dramatiq.actor(broker=stub_broker, exclusive=True)(rebuild)
    with TaskLockService().lock(f"{__name__}.rebuild", ttl=60), pytest.raises(SkipMessage):
        actor("monday")
    free = dramatiq.actor(broker=stub_broker, actor_name="free", exclusive=False)(rebuild)
    assert free.fn is rebuild  # no lock


def test_manage_py_check_names_the_extra_when_dramatiq_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.test import override_settings

    from django_tasklock.contrib import INTEGRATIONS, Integration
    from django_tasklock.contrib.checks import check_integrations

    # As if dramatiq were not installed: its module is one that does not exist.
    monkeypatch.setitem(
        INTEGRATIONS,
        "dramatiq",
        Integration("tasklock_no_dramatiq", "dramatiq", "dramatiq", versions=">=1.17"),
    )
    broker = {
        "MIDDLEWARE": ["dramatiq.middleware.Retries", "django_tasklock.contrib.dramatiq.TaskLock"]
    }
    with override_settings(DRAMATIQ_BROKER=broker):
        (error,) = check_integrations()
    assert error.id == "django_tasklock.E020"
    assert "DRAMATIQ_BROKER names django_tasklock.contrib.dramatiq" in error.msg
    assert "pip install 'dramatiq>=1.17'" in error.msg


def test_lock_option_values_are_checked_at_each_run_before_any_write(stub_broker: Any) -> None:
    import dramatiq

    actor = dramatiq.actor(
        broker=stub_broker, exclusive="rollups:{day}", exclusive_options={"ttl": -1}
    )(rebuild)
    with pytest.raises(ValueError, match="ttl"):
        actor("monday")


def test_outside_a_message_the_dramatiq_retrier_knows_none() -> None:
    processes.require_module("dramatiq")
    import dramatiq.middleware.current_message  # noqa: F401 - looked for in sys.modules

    import django_tasklock.contrib.dramatiq  # noqa: F401
    from django_tasklock.api.retrying import RetryBackoff
    from django_tasklock.contrib import retries

    assert retries.dramatiq(RetryBackoff()) is None


@pytest.fixture
def current_message_broker() -> Any:
    """A stub broker with Dramatiq's own ``CurrentMessage`` (no TaskLock), the global one,
    and a worker of one thread in this process."""
    processes.require_module("dramatiq")
    from dramatiq.middleware import CurrentMessage, Retries

    with global_stub_broker([CurrentMessage(), Retries()]) as broker:
        yield broker


def test_with_current_message_a_held_key_retries_the_message_until_free(
    current_message_broker: Any, key: str
) -> None:
    import dramatiq

    from django_tasklock import TaskLockService, exclusive
    from django_tasklock.backends.memory import MemoryBackend

    service = TaskLockService(MemoryBackend())
    tries: list[int] = []
    runs: list[int] = []

    @exclusive(key, on_locked="retry", service=service)
    def run() -> None:
        runs.append(1)

    @dramatiq.actor(broker=current_message_broker, max_retries=20, throws=(TypeError,))
    def job() -> None:
        tries.append(1)
        run()

    with service.lock(key):
        job.send()
        deadline = time.monotonic() + 30
        while len(tries) < 2:
            assert time.monotonic() < deadline, "never retried"
            time.sleep(0.05)
        assert runs == []
    current_message_broker.join(job.queue_name, timeout=30_000)
    assert runs == [1]
    assert not current_message_broker.dead_letters


def test_the_actors_max_retries_used_up_ends_the_message_as_skipped(
    current_message_broker: Any, key: str
) -> None:
    """The Retries middleware would fail the message (dead letters): the retrier
    makes that try the last, which ends as skipped, acked."""
    import dramatiq

    from django_tasklock import TaskLockService, exclusive
    from django_tasklock.backends.memory import MemoryBackend

    service = TaskLockService(MemoryBackend())
    tries: list[int] = []

    @exclusive(key, on_locked="retry", service=service)
    def run() -> None:
        raise AssertionError("the key is held")  # pragma: no cover

    @dramatiq.actor(broker=current_message_broker, max_retries=1, throws=(TypeError,))
    def job() -> None:
        tries.append(1)
        run()

    with service.lock(key):
        job.send()
        current_message_broker.join(job.queue_name, timeout=30_000)
    assert len(tries) == 2  # the first, and its one retry
    assert not current_message_broker.dead_letters
