"""Leadership: one leader per key among its holders, on every backend (in-process).

Processes are simulated by Leadership objects of their own (each holds its own
token); the scheduler tests (test_beat_leader.py, test_apscheduler_leader.py)
run real processes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone

import pytest

from django_tasklock import Leadership
from django_tasklock.leases.lease import clock as real_clock
from django_tasklock.testing import ContractBackend


def wait_for_condition(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        time.sleep(0.02)


def test_one_of_two_leads_and_the_other_stands_by(any_backend: ContractBackend, key: str) -> None:
    first = Leadership(key, ttl=5, backend=any_backend.backend)
    second = Leadership(key, ttl=5, backend=any_backend.backend)
    try:
        asked = datetime.now(timezone.utc)
        assert first.poll() is True
        assert second.poll() is False
        assert (first.is_leader, second.is_leader) == (True, False)
        since = first.leader_since
        assert since is not None
        assert since >= asked
        assert second.leader_since is None
        assert first.poll() is True  # the leader keeps its term
        assert first.leader_since == since
    finally:
        first.stop()
        second.stop()


def test_a_standby_takes_over_when_the_leader_stops(
    any_backend: ContractBackend, key: str
) -> None:
    first = Leadership(key, ttl=5, backend=any_backend.backend)
    second = Leadership(key, ttl=5, backend=any_backend.backend)
    try:
        assert first.poll()
        first_since = first.leader_since
        first.stop()
        assert not first.is_leader
        assert any_backend.backend.peek(key) is None  # let go at once
        assert second.poll()
        second_since = second.leader_since
        assert first_since is not None
        assert second_since is not None
        assert second_since > first_since
    finally:
        second.stop()


def test_a_leader_whose_lease_was_taken_away_becomes_a_standby_then_leads_again(
    any_backend: ContractBackend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = Leadership(key, ttl=2, refresh_interval=0.1, backend=any_backend.backend)
    try:
        assert first.poll()
        since = first.leader_since
        assert any_backend.backend.force_release(key) is not None
        # The heartbeat's next refresh finds the lease gone: no longer leader.
        wait_for_condition(lambda: not first.is_leader, timeout=10)
        assert first.leader_since is None
        with caplog.at_level(logging.WARNING, logger="django_tasklock"):
            assert first.poll()  # the key is free: a new term
        assert "Leadership %r lost; now a standby." in [r.msg for r in caplog.records]
        assert first.leader_since is not None
        assert since is not None
        assert first.leader_since > since
    finally:
        first.stop()


def test_the_storage_unreachable_leaves_a_standby_that_says_so(
    any_backend: ContractBackend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    if any_backend.unreachable is None:
        pytest.skip(f"{any_backend.name} has no storage to lose")
    standby = Leadership(key, backend=any_backend.unreachable())
    with caplog.at_level(logging.WARNING, logger="django_tasklock"):
        assert standby.poll() is False
        assert standby.poll() is False  # once per outage, not once a second (it was)
    assert not standby.is_leader
    assert caplog.text.count("the storage could not be reached") == 1


def test_near_the_24_hour_cap_the_leader_renews_its_term_and_keeps_its_start(
    any_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = Leadership(key, ttl=5, backend=any_backend.backend)
    try:
        assert first.poll()
        since, before = first.leader_since, any_backend.backend.peek(key)
        # The term began 24 h ago by this clock (a stand-in: nobody waits a day).
        monkeypatch.setattr(
            "django_tasklock.api.leadership.clock", lambda: real_clock() + 24 * 3600
        )
        assert first.poll()
        monkeypatch.setattr("django_tasklock.api.leadership.clock", real_clock)
        after = any_backend.backend.peek(key)
        assert before is not None
        assert after is not None
        assert after.lease != before.lease  # a new lease...
        assert first.leader_since == since  # ...in the same term: nobody led in between
        assert first.poll()
        again = any_backend.backend.peek(key)
        assert again is not None
        assert again.lease == after.lease  # renewed once, not at every poll
    finally:
        first.stop()


def test_start_polls_in_a_thread_until_stop(any_backend: ContractBackend, key: str) -> None:
    holder = Leadership(key, ttl=5, backend=any_backend.backend)
    with Leadership(key, ttl=5, retry_interval=0.05, backend=any_backend.backend) as standby:
        time.sleep(0.2)
        assert standby.is_leader  # the key was free
        assert not holder.poll()
    assert not standby.is_leader
    assert holder.poll()  # stopped: the key was let go
    holder.stop()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retry_interval": 0}, "retry_interval must be positive"),
        ({"retry_interval": "1"}, "retry_interval must be seconds"),
        ({"ttl": -1}, "ttl must be positive"),
        ({"ttl": 5, "refresh_interval": 5}, "refresh_interval"),
    ],
)
def test_bad_options_are_refused_naming_them(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        Leadership("scheduler", **kwargs)  # type: ignore[arg-type]


def test_a_bad_key_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="key must not be empty"):
        Leadership("")


def test_repr_says_leader_or_standby(any_backend: ContractBackend, key: str) -> None:
    first = Leadership(key, backend=any_backend.backend)
    assert repr(first) == f"<Leadership {key!r} standby>"
    first.poll()
    assert repr(first) == f"<Leadership {key!r} leader>"
    first.stop()


def test_a_force_released_leader_stops_leading_at_its_next_poll_not_its_next_refresh(
    any_backend: ContractBackend, key: str
) -> None:
    # A force release lets a standby in at once; the old leader's heartbeat
    # would notice only at its next refresh (ttl / 3 = 10 s here). Before this
    # test, the old leader's poll() said True for those 10 s: two leaders, and
    # a Celery beat fired every tick twice meanwhile.
    first = Leadership(key, ttl=30, backend=any_backend.backend)
    second = Leadership(key, ttl=30, backend=any_backend.backend)
    try:
        assert first.poll()
        assert any_backend.backend.force_release(key) is not None
        assert second.poll()  # the key is free: the standby takes it at once
        assert first.poll() is False
        assert (first.is_leader, first.leader_since) == (False, None)
        assert second.poll()  # the old leader took nothing back from the new one
        assert any_backend.backend.peek(key) is not None
    finally:
        first.stop()
        second.stop()
