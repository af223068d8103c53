"""How held locks are shown to operators (commands and admin)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from django_tasklock import display
from django_tasklock.backends.base import HeldLock, Holder

PARIS = timezone(timedelta(hours=1))


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 11, 30, 12, 45, 1),  # naive, from USE_TZ = False: UTC
        datetime(2026, 11, 30, 12, 45, 1, tzinfo=timezone.utc),
        datetime(2026, 11, 30, 13, 45, 1, tzinfo=PARIS),
    ],
)
def test_times_are_shown_in_utc(moment: datetime) -> None:
    assert display.utc(moment) == datetime(2026, 11, 30, 12, 45, 1, tzinfo=timezone.utc)
    assert display.utc(moment).utcoffset() == timedelta(0)
    assert display.when(moment) == "2026-11-30 12:45:01 UTC"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.04, "0.0 s"),
        (4.25, "4.2 s"),
        (59.9, "59.9 s"),
        (60, "1 min 00 s"),
        (898.7, "14 min 58 s"),
        (3599, "59 min 59 s"),
        (3600, "1 h 00 min"),
        (7380, "2 h 03 min"),
        (86400, "24 h 00 min"),
    ],
)
def test_durations(seconds: float, shown: str) -> None:
    assert display.duration(seconds) == shown


def test_held_is_read_on_the_storages_clock_alone() -> None:
    # The storage read at 12:10:00 (expires 12:15:00, 300 s left): held 10 min,
    # whatever this machine's clock says.
    acquired = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
    lock = HeldLock(
        key="k",
        holder=Holder("h", 1),
        acquired_at=acquired,
        expires_at=acquired + timedelta(minutes=15),
        seconds_left=300.0,
    )
    assert display.seconds_held(lock) == 600.0
    assert display.as_json(lock)["seconds_held"] == 600.0
    # A lease acquired "after" the reading (clock steps between two servers): 0, not < 0.
    early = HeldLock("k", Holder("h", 1), acquired, acquired + timedelta(seconds=5), 10.0)
    assert display.seconds_held(early) == 0.0
