"""How held locks are shown to operators (commands and admin)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from django_tasklock import display

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
def test_time_left(seconds: float, shown: str) -> None:
    assert display.time_left(seconds) == shown
