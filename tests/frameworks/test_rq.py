"""``django_tasklock.contrib.rq.exclusive`` on RQ jobs run by two real ``rqworker`` processes.

The workers are django-rq's ``manage.py rqworker`` (RQ's forking worker: each
job runs in a fresh child); the queue and the locks are in Redis, the queue
named for this run alone, the lock keys carrying this run's id.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from django_tasklock import TaskLockService
from django_tasklock.api.retrying import DEFAULT_BACKOFF
from django_tasklock.testing.support import wait_until
from tests.jobs import PATIENCE, wait_for
from tests.support import framework_runs, processes, rerun_runs

RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def queue(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An RQ queue of this run's own, served by two ``manage.py rqworker`` processes."""
    processes.require_module("rq")
    processes.require_module("django_rq")
    import redis
    from rq import Queue

    url = processes.redis_url()
    name = f"tasklock-tests-{RUN}"
    rq_queue = Queue(name, connection=redis.Redis.from_url(url))
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.jobs.rq_settings",
        "TASKLOCK_TEST_SQLITE": str(connections["default"].settings_dict["NAME"]),
        "TASKLOCK_TEST_REDIS_URL": url,
        "TASKLOCK_TEST_RQ_QUEUE": name,
    }
    logs = tmp_path_factory.mktemp("rqworker")
    # The scheduler enqueues the jobs that returned RQ's Retry when their interval is up.
    args = ["django", "rqworker", name, "--with-scheduler"]
    try:
        with (
            processes.worker([*args, f"--name={name}-1"], env, logs / "first.log"),
            processes.worker([*args, f"--name={name}-2"], env, logs / "second.log"),
        ):
            assert outcome(rq_queue.enqueue("tests.jobs.rq_jobs.ping")) == "pong"
            yield rq_queue
    finally:
        forget(rq_queue)


def forget(rq_queue: Any) -> None:
    """Delete the queue, its jobs and its registries (which have no expiry) from Redis."""
    rq_queue.delete(delete_jobs=True)
    for stored in rq_queue.connection.scan_iter(f"rq:*:{rq_queue.name}*"):
        rq_queue.connection.delete(stored)


def outcome(job: Any) -> Any:
    """The return value of an RQ job once a worker has finished it."""
    deadline = time.monotonic() + PATIENCE
    while (status := job.get_status(refresh=True)).value != "finished":
        assert status.value != "failed", job.latest_result().exc_string
        assert time.monotonic() < deadline, f"job {job.id} still {status}"
        time.sleep(0.05)
    return job.return_value(refresh=True)


def test_a_job_whose_key_is_held_is_skipped_and_says_so_in_its_meta(
    queue: Any, tmp_path: Path
) -> None:
    key = f"{RUN}-same"
    first = queue.enqueue("tests.jobs.rq_jobs.hold_key", key, "first", str(tmp_path))
    wait_for(tmp_path / "first.holding")
    second = queue.enqueue("tests.jobs.rq_jobs.hold_key", key, "second", str(tmp_path))
    assert outcome(second) is None  # the other worker skipped it
    assert not (tmp_path / "second.holding").exists()
    second.refresh()
    assert second.meta["tasklock"] == {"skipped": True, "key": f"rq:{key}"}
    (tmp_path / "first.release").touch()
    assert outcome(first) == "ran:first"
    first.refresh()
    assert "tasklock" not in first.meta


def test_a_job_that_runs_after_it_was_skipped_no_longer_says_skipped(
    queue: Any, tmp_path: Path
) -> None:
    """The same job (same id) run again (here by ``requeue()``; RQ's ``Retry`` and
    ``Repeat`` do the same): its meta says what its latest run did."""
    key = f"{RUN}-again"
    holder = queue.enqueue("tests.jobs.rq_jobs.hold_key", key, "holder", str(tmp_path))
    wait_for(tmp_path / "holder.holding")
    job = queue.enqueue("tests.jobs.rq_jobs.run_or_fail", key)
    deadline = time.monotonic() + PATIENCE
    while job.get_status(refresh=True).value != "failed":  # on_locked raised: key held
        assert time.monotonic() < deadline, f"job {job.id} still {job.get_status()}"
        time.sleep(0.05)
    job.refresh()
    assert job.meta["tasklock"] == {"skipped": True, "key": f"rq:{key}"}
    (tmp_path / "holder.release").touch()
    assert outcome(holder) == "ran:holder"
    job.requeue()
    assert outcome(job) == "ran"
    job.refresh()
    assert "tasklock" not in job.meta


def test_jobs_of_different_keys_run_at_the_same_time(queue: Any, tmp_path: Path) -> None:
    one = queue.enqueue("tests.jobs.rq_jobs.hold_key", f"{RUN}-one", "one", str(tmp_path))
    two = queue.enqueue("tests.jobs.rq_jobs.hold_key", f"{RUN}-two", "two", str(tmp_path))
    # Both hold their keys at once: neither waited for the other.
    wait_for(tmp_path / "one.holding")
    wait_for(tmp_path / "two.holding")
    (tmp_path / "one.release").touch()
    (tmp_path / "two.release").touch()
    assert (outcome(one), outcome(two)) == ("ran:one", "ran:two")


def test_fifty_overlapping_jobs_of_one_key_on_two_workers_never_overlap(
    queue: Any, tmp_path: Path
) -> None:
    key = f"{RUN}-volume"
    # Each hold 0.3 s: RQ forks a work horse per job, and on a loaded machine a fork took
    # up to 1.4 s; with 0.05 s holds the two workers' holds never met in 50 jobs (no job
    # skipped) in a CI run.
    jobs = [queue.enqueue("tests.jobs.rq_jobs.record", key, str(tmp_path), 0.3) for _ in range(50)]
    runs = framework_runs.await_runs(tmp_path, 50)
    framework_runs.assert_one_at_a_time(runs, 50)
    assert sorted(outcome(job) for job in jobs) == sorted(
        ["ran"] * len(runs.ran_by) + ["skipped"] * len(runs.skipped_by)
    )


@pytest.mark.databases  # the locks: the test's SQLite file
def test_two_workers_twenty_triggers_during_a_run_make_exactly_one_more_run(
    queue: Any, tmp_path: Path
) -> None:
    """The holder takes one ``rqworker``; the other skips the 20 (each in a work horse)."""
    key = f"{RUN}-rerun-{tmp_path.name}"
    rerun_runs.twenty_triggers(
        lambda n: queue.enqueue(
            "tests.jobs.rq_jobs.rebuild", key, str(tmp_path), n, job_timeout=777, failure_ttl=999
        ),
        tmp_path,
        sent_again=True,
    )

    # The job sent again is enqueued with the timeouts of the one skipped.
    def finished() -> list[Any]:
        jobs = [queue.fetch_job(x) for x in queue.finished_job_registry.get_job_ids()]
        return [job for job in jobs if job is not None and list(job.args[:1]) == [key]]

    # The holder's, the 20 skipped, and the one sent again, once RQ has filed it.
    wait_until(lambda: len(finished()) == 22, timeout=PATIENCE)
    ours = finished()
    assert {(job.timeout, job.failure_ttl) for job in ours} == {(777, 999)}


def await_retried(job: Any) -> int:
    """``job.number_of_retries`` (the ``Retry`` results it returned) once it is 1 or more."""
    deadline = time.monotonic() + PATIENCE
    while True:
        job.refresh()
        if job.number_of_retries:
            return int(job.number_of_retries)
        assert job.get_status().value != "failed", job.latest_result().exc_string
        assert time.monotonic() < deadline, f"job {job.id} still {job.get_status()}"
        time.sleep(0.05)


def test_a_job_whose_key_is_held_returns_a_retry_until_it_is_free_then_runs_once(
    queue: Any, tmp_path: Path
) -> None:
    from rq.results import Result

    from django_tasklock.backends.redis import RedisBackend

    key = f"{RUN}-retry"
    holder = TaskLockService(RedisBackend(url=processes.redis_url()))
    with holder.lock(f"rq:{key}", ttl=60):
        job = queue.enqueue("tests.jobs.rq_jobs.retried", key, str(tmp_path))
        await_retried(job)  # try 1 returned a Retry
        time.sleep(0.5)  # let the next try start, so that the pending interval is a later one
        retried = await_retried(job)
        releasing = time.time()
    released = time.time()
    assert outcome(job) == "ran"
    runs = framework_runs.read_runs(tmp_path)
    assert len(runs.intervals) == 1, runs  # exactly one run
    entry = runs.intervals[0][0]
    assert entry >= releasing  # never beside the holder
    # The try pending at the release was asked for by try ``retried`` (or the next, had
    # it found the key held just before the release): an interval of at most
    # 2 ** (n - 1) s, rounded up; the scheduler looks every second; 30 s of slack.
    pending = min(DEFAULT_BACKOFF.most, 2**retried) + 1
    assert entry - released <= pending + 30, (entry - released, retried)
    job.refresh()
    kinds = [result.type for result in job.results()]  # newest first
    assert kinds[0] == Result.Type.SUCCESSFUL
    assert kinds[1:] == [Result.Type.RETRIED] * job.number_of_retries
    assert job.number_of_retries in (retried, retried + 1)


@pytest.mark.databases
def test_a_direct_call_outside_a_worker_is_the_core_decorator(tmp_path: Path) -> None:
    processes.require_module("rq")
    from tests.jobs import rq_jobs

    (tmp_path / "direct.release").touch()
    assert rq_jobs.hold_key(f"{RUN}-direct", "direct", str(tmp_path)) == "ran:direct"
    with TaskLockService().lock(f"rq:{RUN}-direct", ttl=60):
        assert rq_jobs.hold_key(f"{RUN}-direct", "direct", str(tmp_path)) is None


@pytest.mark.databases
def test_a_simple_worker_in_this_process_marks_the_skipped_job(tmp_path: Path) -> None:
    """RQ's SimpleWorker (no fork): the lock is this process's (the database backend)."""
    processes.require_module("rq")
    import redis
    from rq import Queue, SimpleWorker

    connection = redis.Redis.from_url(processes.redis_url())
    rq_queue = Queue(f"tasklock-tests-{RUN}-simple", connection=connection)
    try:
        job = rq_queue.enqueue(
            "tests.jobs.rq_jobs.hold_key", f"{RUN}-simple", "job", str(tmp_path)
        )
        with TaskLockService().lock(f"rq:{RUN}-simple", ttl=60):
            assert SimpleWorker([rq_queue], connection=rq_queue.connection).work(burst=True)
        job.refresh()  # type: ignore[no-untyped-call]
        assert job.get_status().value == "finished"
        assert job.return_value() is None
        assert job.meta["tasklock"] == {"skipped": True, "key": f"rq:{RUN}-simple"}
    finally:
        forget(rq_queue)


@pytest.mark.databases
def test_a_skipped_call_inside_another_job_leaves_that_jobs_meta_alone(tmp_path: Path) -> None:
    """A job that ran, calling an ``@exclusive`` function whose key was held: the job was
    not skipped, and its meta does not say so."""
    processes.require_module("rq")
    import redis
    from rq import Queue, SimpleWorker

    connection = redis.Redis.from_url(processes.redis_url())
    rq_queue = Queue(f"tasklock-tests-{RUN}-nested", connection=connection)
    try:
        job = rq_queue.enqueue("tests.jobs.rq_jobs.calls_quick", f"{RUN}-nested")
        with TaskLockService().lock(f"rq:{RUN}-nested", ttl=60):
            assert SimpleWorker([rq_queue], connection=rq_queue.connection).work(burst=True)
        job.refresh()  # type: ignore[no-untyped-call]
        assert job.return_value() == "called:None"  # it ran; the call inside was skipped
        assert "tasklock" not in job.meta
    finally:
        forget(rq_queue)


def test_rq_job_below_exclusive_is_a_type_error_naming_the_order() -> None:
    processes.require_module("rq")
    from rq.decorators import job

    from django_tasklock.contrib.rq import exclusive

    def rebuild(day: str) -> None: ...

    queued = job("default", connection=object())(rebuild)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="put @job above @exclusive"):
        exclusive("rollups:{day}")(queued)
    with pytest.raises(TypeError, match="put @job above @exclusive"):
        exclusive(queued)


def test_bad_arguments_are_refused_at_decoration_as_by_the_core_decorator() -> None:
    processes.require_module("rq")
    from django_tasklock.contrib.rq import exclusive

    def rebuild(day: str) -> None: ...

    with pytest.raises(ValueError, match="month"):
        exclusive("rollups:{month}")(rebuild)
    with pytest.raises(ValueError, match="ttl"):  # values: at each call, before any write
        exclusive("rollups:{day}", ttl=-1)(rebuild)("2024-05-01")
    with pytest.raises(TypeError, match="on_locked"):
        exclusive("rollups:{day}", on_locked=3)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="key twice"):
        exclusive("rollups:{day}", key="rollups")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="function and key="):
        exclusive(rebuild, key="rollups")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"exclusive\(key=\.\.\.\)"):
        exclusive(lambda day: day)  # a key function given positionally
    with pytest.raises(TypeError, match="ttl_seconds"):
        exclusive("rollups:{day}", ttl_seconds=5)  # type: ignore[call-overload]


@pytest.mark.databases
def test_bare_exclusive_locks_the_functions_dotted_name() -> None:
    processes.require_module("rq")
    from django_tasklock.contrib.rq import exclusive

    @exclusive
    def rebuild(day: str) -> str:
        return f"rebuilt {day}"

    assert rebuild("monday") == "rebuilt monday"
    with TaskLockService().lock(f"{__name__}.{rebuild.__qualname__}", ttl=60):
        assert rebuild("monday") is None
