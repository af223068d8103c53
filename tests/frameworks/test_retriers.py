"""The frameworks' retriers (``contrib.retries``) outside any task: none plans a retry.

Their retries with real workers: test_celery.py and test_rq.py.
"""

from __future__ import annotations

import math
import sys

import pytest

from django_tasklock.api import retrying
from django_tasklock.api.retrying import RetryBackoff
from django_tasklock.contrib import retries
from tests.support import processes


def test_every_retrier_is_installed_by_the_apps_ready() -> None:
    assert set(retries.RETRIERS) <= set(retrying._retriers)
    assert retries.rq in retries.RETRIERS


def test_celery_outside_a_task_plans_nothing() -> None:
    processes.require_module("celery")
    import celery

    assert not celery.current_task  # a proxy of None
    assert retries.celery(RetryBackoff()) is None


def test_rq_outside_a_job_plans_nothing() -> None:
    processes.require_module("rq")
    import rq

    assert rq.get_current_job() is None
    assert retries.rq(RetryBackoff()) is None


def test_without_the_frameworks_imported_nothing_is_planned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "celery", raising=False)
    monkeypatch.delitem(sys.modules, "rq", raising=False)
    assert retries.celery(RetryBackoff()) is None
    assert retries.rq(RetryBackoff()) is None


class FakeJob:
    """What the RQ retrier reads of the running job."""

    def __init__(self, number_of_retries: int | None) -> None:
        self.number_of_retries = number_of_retries


@pytest.fixture
def rq_job(monkeypatch: pytest.MonkeyPatch) -> FakeJob:
    processes.require_module("rq")
    import rq

    job = FakeJob(None)
    monkeypatch.setattr(rq, "get_current_job", lambda: job)
    return job


def test_rq_returns_a_retry_of_whole_seconds_counting_tries_from_its_retries(
    rq_job: FakeJob,
) -> None:
    from rq import Retry

    backoff = RetryBackoff(first=1.5, most=60.0, tries=4)
    for retries_so_far, whole in [(None, 1.5), (1, 3.0), (2, 6.0)]:
        rq_job.number_of_retries = retries_so_far
        plan = retries.rq(backoff)
        assert plan is not None
        assert plan.framework == "RQ"
        assert plan.attempt == (retries_so_far or 0) + 1
        assert plan.countdown is not None
        assert plan.countdown == int(plan.countdown)
        assert max(1, math.ceil(whole / 2)) <= plan.countdown <= math.ceil(whole)
        retry = plan.act()
        assert isinstance(retry, Retry)
        assert retry.max == backoff.tries - 1
        assert retry.intervals == [plan.countdown]
    rq_job.number_of_retries = 3  # try 4 of 4: the last
    plan = retries.rq(backoff)
    assert plan is not None
    assert (plan.attempt, plan.countdown, plan.act()) == (4, None, None)


def test_rq_intervals_are_at_least_a_second(rq_job: FakeJob) -> None:
    plan = retries.rq(RetryBackoff(first=0.1))
    assert plan is not None
    assert plan.countdown == 1


def test_an_rq_without_retry_results_plans_nothing(
    rq_job: FakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ before return-based retries: its jobs have no ``number_of_retries``."""
    import rq

    monkeypatch.setattr(rq, "get_current_job", lambda: object())
    assert retries.rq(RetryBackoff()) is None
