"""unique_on's claims in this process, on every backend; bad input; Celery's send failing.

Real workers: test_unique_celery.py and test_unique_django_tasks.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import override_settings

from django_tasklock.api.unique import claim, run_claimed, unclaim
from django_tasklock.exceptions import AlreadyEnqueued, TaskLockError
from django_tasklock.locking.lock import current_lock
from django_tasklock.testing import ContractBackend
from tests.support import processes


def test_a_claim_refuses_the_same_key_until_its_task_ran(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    token = claim(key, ttl=60, backend=backend)
    with pytest.raises(AlreadyEnqueued) as refused:
        claim(key, ttl=60, backend=backend)
    assert isinstance(refused.value, TaskLockError)
    assert refused.value.key == key
    assert refused.value.held is not None
    assert f"unique key {key!r}" in str(refused.value)
    ran, result = run_claimed(key, token, lambda: "done", ttl=60, backend=backend)
    assert (ran, result) == (True, "done")
    assert backend.peek(key) is None  # freed when the task ended
    unclaim(key, claim(key, ttl=60, backend=backend), backend=backend)
    assert backend.peek(key) is None


def test_a_task_that_raises_frees_its_key(any_backend: ContractBackend, key: str) -> None:
    backend = any_backend.backend
    token = claim(key, ttl=60, backend=backend)

    def fail() -> None:
        raise ValueError("task failed")

    with pytest.raises(ValueError, match="task failed"):
        run_claimed(key, token, fail, ttl=60, backend=backend)
    assert backend.peek(key) is None


def test_the_worker_extends_the_claim_to_its_ttl_when_the_task_starts(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    token = claim(key, ttl=0.5, backend=backend)
    seen: list[float] = []

    def task() -> None:
        time.sleep(0.7)  # past the enqueue's 0.5 s: still held, extended at the start
        held = backend.peek(key)
        assert held is not None
        seen.append(held.seconds_left)

    assert run_claimed(key, token, task, ttl=30, backend=backend)[0]
    assert seen[0] > 20


def test_a_task_that_waited_past_its_ttl_runs_if_nobody_took_the_key(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    token = claim(key, ttl=0.05, backend=backend)
    time.sleep(0.2)
    assert run_claimed(key, token, lambda: "late", ttl=60, backend=backend) == (True, "late")


def test_a_task_that_waited_past_its_ttl_does_not_run_once_another_took_the_key(
    any_backend: ContractBackend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = any_backend.backend
    stale = claim(key, ttl=0.05, backend=backend)
    time.sleep(0.2)
    newer = claim(key, ttl=60, backend=backend)  # the key ran out: a new enqueue took it
    with caplog.at_level("INFO", logger="django_tasklock"):
        assert run_claimed(key, stale, lambda: "ran", ttl=60, backend=backend) == (False, None)
    assert "held by an identical task enqueued after it" in caplog.text
    held = backend.peek(key)
    assert held is not None  # the newer task's claim is untouched
    unclaim(key, newer, backend=backend)


def test_a_task_run_again_under_its_claim_after_it_ended_runs_while_the_key_is_free(
    any_backend: ContractBackend, key: str
) -> None:
    # A retry that raises nothing (Celery's retry(throw=False)) or a message delivered
    # again runs under the claim a release already ended: on Redis that token is
    # refused (its late copies must write nothing), so the run takes the free key as
    # any caller would, and frees it after.
    backend = any_backend.backend
    token = claim(key, ttl=60, backend=backend)
    assert run_claimed(key, token, lambda: "first", ttl=60, backend=backend) == (True, "first")
    assert run_claimed(key, token, lambda: "again", ttl=60, backend=backend) == (True, "again")
    assert backend.peek(key) is None
    # Still refused while an identical task holds the key:
    newer = claim(key, ttl=60, backend=backend)
    assert run_claimed(key, token, lambda: "ran", ttl=60, backend=backend) == (False, None)
    unclaim(key, newer, backend=backend)


@override_settings(TASKLOCK_DEFAULTS={"max_lifetime": 3})
def test_a_claim_taken_over_late_is_lost_when_the_storage_caps_it(
    any_backend: ContractBackend, key: str
) -> None:
    # The storage caps the claim at the *enqueue* + max_lifetime. A worker counting
    # the cap from its takeover believed it held the key for 1.5 s after the
    # storage let it go, while an identical enqueue was accepted.
    backend = any_backend.backend
    token = claim(key, ttl=2, backend=backend)
    time.sleep(1.5)  # waiting in the queue, half the cap
    seen: list[tuple[bool, float]] = []

    def task() -> None:
        lock = current_lock()
        assert lock is not None
        assert not lock.lost
        started = time.monotonic()
        while backend.peek(key) is not None:  # the refreshes keep it: until the cap
            assert time.monotonic() - started < 15, "the storage never capped the claim"
            time.sleep(0.02)
        rival = claim(key, ttl=2, backend=backend)  # an identical enqueue: accepted
        seen.append((lock.lost, time.monotonic() - started))
        unclaim(key, rival, backend=backend)

    assert run_claimed(key, token, task, ttl=2, backend=backend) == (True, None)
    lost, waited = seen[0]
    assert lost, f"the task still held the key {waited:.2f} s in, by the storage's cap"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"key": "", "ttl": 5}, ValueError, "key must not be empty"),
        ({"key": "k", "ttl": 0}, ValueError, "ttl must be positive"),
        ({"key": "k", "ttl": "5"}, TypeError, "ttl must be seconds"),
    ],
)
def test_bad_input_is_refused_naming_it(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        claim(**kwargs)


def test_django_tasks_unique_on_goes_above_task_and_refuses_what_it_cannot_do() -> None:
    from django_tasklock.contrib.django_tasks import unique_on

    def plain(name: str) -> None: ...

    with pytest.raises(TypeError, match=r"@unique_on goes above @task\(\)"):
        unique_on("unique:{name}")(plain)
    from tests.jobs import django_unique

    task = django_unique.hold_unique
    with pytest.raises(ValueError, match="names 'nope', which is not a parameter"):
        unique_on("unique:{nope}")(task)
    with pytest.raises(ValueError, match="ttl must be positive"):
        unique_on("unique:{name}", ttl=0)(task)


@pytest.mark.databases
def test_celery_unique_task_frees_the_key_when_the_message_cannot_be_sent(key: str) -> None:
    processes.require_module("celery")
    from celery import Celery

    from django_tasklock.backends import get_backend
    from django_tasklock.contrib.celery import UniqueTask

    # Nothing listens on port 1: the send fails at once, for real.
    app = Celery("unsent", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.update(broker_connection_retry=False, broker_connection_max_retries=0)

    @app.task(base=UniqueTask, unique_on=lambda name: f"{key}:{name}", shared=False)  # type: ignore[untyped-decorator]
    def job(name: str) -> None: ...

    with pytest.raises(Exception):  # noqa: B017, PT011 - kombu's connection error
        job.delay("x")
    assert get_backend().peek(f"{key}:x") is None


@pytest.mark.databases
def test_celery_unique_task_runs_under_the_claim_it_carries_and_a_revoke_frees_it(
    key: str,
) -> None:
    """In this process (``apply()``, the ``task_revoked`` signal): what the worker does."""
    processes.require_module("celery")
    from celery import Celery
    from celery.app.task import Context
    from celery.signals import task_revoked

    from django_tasklock.backends import get_backend
    from django_tasklock.contrib.celery import UniqueTask
    from django_tasklock.contrib.celery.unique import HEADER

    app = Celery("in-process", broker="memory://", set_as_current=False)

    @app.task(base=UniqueTask, unique_on="{name}", shared=False)  # type: ignore[untyped-decorator]
    def job(name: str) -> bool:
        return get_backend().peek(name) is not None  # held while it runs

    token = claim(key, ttl=60)
    assert job.apply((key,), headers={HEADER: [key, token]}).get() is True
    assert get_backend().peek(key) is None  # freed when it ended
    assert job.apply((key,)).get() is False  # no claim carried: runs, holds nothing
    token = claim(key, ttl=60)
    request = Context({"headers": {HEADER: [key, token]}})
    task_revoked.send(sender=job, request=request, terminated=False, signum=None, expired=False)
    assert get_backend().peek(key) is None
