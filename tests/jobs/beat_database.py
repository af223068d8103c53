"""LeaderDatabaseScheduler against django-celery-beat's real tables (``python -m``).

Run by tests/frameworks/test_celery_beat_scheduler.py in a process of its own (the test
suite's settings do not install django-celery-beat): migrates a fresh SQLite
file, makes two schedulers of one app, and checks what a new leader does to a
schedule row another beat left stale, and that a beat whose term ended saves
nothing over the new leader's rows. Exits 0 when every check passed.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import django

django.setup()

from celery import Celery  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django_celery_beat.models import PeriodicTask  # noqa: E402

from django_tasklock.backends import get_backend  # noqa: E402
from django_tasklock.contrib.celery import LeaderDatabaseScheduler  # noqa: E402


def main() -> None:
    call_command("migrate", verbosity=0)
    app = Celery("leader-db-tests", broker="memory://", set_as_current=False)
    app.conf.update(
        beat_schedule={"hourly": {"task": "tests.hourly", "schedule": timedelta(hours=1)}},
        tasklock_beat_key=f"beat-db-{uuid.uuid4().hex[:8]}",
        tasklock_beat_ttl=5,
        tasklock_beat_retry_interval=0.25,
        timezone="UTC",
    )
    first = LeaderDatabaseScheduler(app=app)
    second = LeaderDatabaseScheduler(app=app)
    first.tick()
    assert first.leadership.is_leader
    assert second.tick() == 0.25, "a standby waits retry_interval"
    # The row as a beat that died long ago left it: due at once.
    stale = first.schedule["hourly"].last_run_at - timedelta(days=1)
    PeriodicTask.objects.filter(name="hourly").update(last_run_at=stale)
    first.close()  # lets go: the standby leads at its next look
    second.tick()
    since = second.leadership.leader_since
    assert since is not None, "the standby took over"
    assert second.schedule["hourly"].last_run_at >= since
    second.sync()
    row = PeriodicTask.objects.get(name="hourly")
    assert row.last_run_at is not None
    assert row.last_run_at >= since, (row.last_run_at, since)
    third = former_leader_saves_nothing(app, second, tick_first=True)
    former_leader_saves_nothing(app, third, tick_first=False).close()
    print("ok")


def former_leader_saves_nothing(
    app: Celery, leader: LeaderDatabaseScheduler, *, tick_first: bool
) -> LeaderDatabaseScheduler:
    """A beat whose term ended writes none of its rows at close: the new leader's are newer.

    Before: its close() saved the rows it had marked while leading, whose
    last_run_at predate the new leader's term, over the new leader's, and the
    new leader's next full read of the rows fired them again.
    """
    assert leader.leadership.is_leader
    entry = leader.schedule["hourly"]
    entry.last_run_at = entry.last_run_at - timedelta(hours=2)  # due now
    leader._heap = None
    leader._last_sync = time.monotonic()  # synced a moment ago: the next sync is minutes away
    leader.tick()  # fires it: the row is marked, to be saved at the next sync
    assert "hourly" in leader._dirty, "fired"
    get_backend().force_release(leader.leadership.key)
    other = LeaderDatabaseScheduler(app=app)
    other.tick()
    since = other.leadership.leader_since
    assert since is not None, "the other beat took over"
    other.sync()
    if tick_first:
        assert leader.tick() == 0.25, "the former leader is a standby"
    # else: closed before any look found the lease gone (the heartbeat's neither)
    leader.close()
    row = PeriodicTask.objects.get(name="hourly")
    assert row.last_run_at is not None
    assert row.last_run_at >= since, ("the former leader wrote its rows", row.last_run_at, since)
    return other


if __name__ == "__main__":
    main()
