"""The frameworks' senders of ``on_locked="rerun"`` (``contrib.reruns``) without a worker.

Outside a task none describes a call. django-q2's and Django's Tasks
framework's know the running task from their workers' signals (connected by
the app's ``ready()``), sent here by hand. With real workers, a skipped call
sent again: ``twenty_triggers`` in test_celery.py, test_rq.py,
test_django_q2.py, test_django_tasks.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps

from django_tasklock.api import rerun
from django_tasklock.contrib import reruns
from tests import jobs
from tests.support import processes


def test_every_sender_is_installed_by_the_apps_ready() -> None:
    assert {sender.framework for sender in reruns.SENDERS} >= {
        "Celery",
        "RQ",
        "django-q2",
        "django.tasks",
    }
    assert all(rerun._senders[sender.framework] == sender for sender in reruns.SENDERS)


@pytest.mark.parametrize(
    "describe",
    [
        reruns.celery_describe,
        reruns.rq_describe,
        reruns.django_q2_describe,
        reruns.django_tasks_describe,
    ],
)
def test_outside_a_task_no_sender_describes_a_call(describe: Any) -> None:
    for module in ("celery", "rq", "django_q", "django_tasks"):
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
    assert describe() is None
    assert rerun.running_call() == ""


def test_without_the_frameworks_imported_nothing_is_described(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "celery", raising=False)
    monkeypatch.delitem(sys.modules, "rq", raising=False)
    assert reruns.celery_describe() is None
    assert reruns.rq_describe() is None


class FakeJob:
    """What the RQ sender reads of the running job."""

    def __init__(self, func_name: str, instance: object = None) -> None:
        self.func_name = func_name
        self.instance = instance
        self.args = ("day", 3)
        self.kwargs = {"force": True}
        self.origin = "nightly"
        self.timeout = 3600
        self.result_ttl = None
        self.failure_ttl = 86400
        self.ttl = None


def test_rq_describes_the_current_jobs_function_arguments_and_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    processes.require_module("rq")
    import rq

    job = FakeJob("app.jobs.rebuild")
    monkeypatch.setattr(rq, "get_current_job", lambda: job)
    assert reruns.rq_describe() == {
        "task": "app.jobs.rebuild",
        "args": ["day", 3],
        "kwargs": {"force": True},
        "queue": "nightly",
        "timeout": 3600,
        "result_ttl": None,
        "failure_ttl": 86400,
        "ttl": None,
    }
    job.instance = object()  # a method of an instance: no name reaches it
    assert reruns.rq_describe() is None
    monkeypatch.setattr(rq, "get_current_job", lambda: FakeJob("app.jobs.<lambda>"))
    assert reruns.rq_describe() is None


def test_rq_send_outside_a_job_without_django_rq_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A holder that never imported RQ (a web process, a management command), nor
    # django-rq: the send says why it cannot, not KeyError('rq').
    processes.require_module("rq")
    monkeypatch.delitem(sys.modules, "rq", raising=False)
    monkeypatch.delitem(sys.modules, "django_rq", raising=False)
    call = {"task": "app.jobs.rebuild", "args": [], "kwargs": {}, "queue": "nightly"}
    with pytest.raises(RuntimeError, match="no RQ job runs in the holder"):
        reruns.rq_send(call)


def test_django_q2_describes_the_task_between_its_workers_signals() -> None:
    # The receivers themselves: django_q is no installed app of the tests' settings, and
    # its signals module, importing its settings (Q_CLUSTER, unset here), warns.
    task = {
        "func": "app.tasks.rebuild",
        "args": ("day",),
        "kwargs": {"group": "a keyword of the function"},
        "group": "nightly",
        "hook": len,
    }
    reruns._q2_started(sender="django_q", func=None, task=task)
    try:
        assert reruns.django_q2_describe() == {
            "task": "app.tasks.rebuild",
            "args": ["day"],
            "kwargs": {"group": "a keyword of the function"},
            "q_options": {"group": "nightly", "hook": "builtins.len", "ack_failure": False},
        }
        assert rerun.running_call().startswith('{"framework": "django-q2"')
    finally:
        reruns._q2_finished(sender="django_q", func=None, task=task)
    assert reruns.django_q2_describe() is None


def test_django_tasks_describes_the_task_between_its_workers_signals() -> None:
    if not apps.is_installed("django_tasks"):
        pytest.skip("the django-tasks backport is no installed app here")
    from django_tasks.signals import task_finished, task_started

    task = SimpleNamespace(
        module_path="app.tasks.rebuild", backend="database", queue_name="q", priority=3
    )
    result = SimpleNamespace(
        id="1",
        status="RUNNING",
        task=task,
        args=["day"],
        kwargs={"n": 1, "tasklock_unique": ["key", "token"]},
    )
    task_started.send(sender=object, task_result=result)  # connected by the app's ready()
    try:
        assert reruns.django_tasks_describe() == {
            "task": "app.tasks.rebuild",
            "args": ["day"],
            "kwargs": {"n": 1},  # unique_on's claim is never sent again
            "backend": "database",
            "queue_name": "q",
            "priority": 3,
        }
    finally:
        task_finished.send(sender=object, task_result=result)
    assert reruns.django_tasks_describe() is None


def test_a_django_task_whose_task_finished_we_missed_is_not_described_after_it() -> None:
    """The immediate backend runs a task on the caller's thread (a web request's). A receiver
    of ``task_finished`` that runs before ours raises, so ours never runs: the task has
    ended all the same, and a call made after it is described as no task's."""
    if not jobs.HAS_DJANGO_TASKS:
        pytest.skip("neither django.tasks nor the django-tasks backport is installed")
    from tests.jobs import django_tasks

    signals: Any = importlib.import_module(f"{jobs._tasks_package}.signals")
    ours = f"django_tasklock.reruns.{jobs._tasks_package}.signals.finished"

    def fails(sender: object, **kwargs: Any) -> None:
        raise RuntimeError("a receiver of task_finished failed")

    assert signals.task_finished.disconnect(dispatch_uid=ours)  # ready() connected it
    signals.task_finished.connect(fails, dispatch_uid="test-fails")
    signals.task_finished.connect(reruns._tasks_finished, dispatch_uid=ours)
    django_tasks.described.clear()
    try:
        with pytest.raises(RuntimeError, match="a receiver of task_finished failed"):
            django_tasks.describe_running.enqueue(7)
    finally:
        signals.task_finished.disconnect(dispatch_uid="test-fails")
    described = django_tasks.described
    assert [call and (call["task"], call["args"]) for call in described] == [
        ("tests.jobs.django_tasks.describe_running", [7])
    ]
    assert reruns.django_tasks_describe() is None
    assert rerun.running_call() == ""
