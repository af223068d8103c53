"""How held locks are shown to operators (commands and admin)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from django_tasklock.backends.base import HeldLock, Holder
from django_tasklock.ops import display

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


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("report:2026-11-30", "report:2026-11-30"),  # printable: as it is
        ("café ☕ 報告", "café ☕ 報告"),  # printable beyond ASCII too
        ("a\x1b[2Jb\x07", r"a\x1b[2Jb\x07"),
        ("row\r\nforged\tcell", r"row\r\nforged\tcell"),
        ("\x7f\x85\x9b", r"\x7f\x85\x9b"),  # DEL, C1 controls (NEL, CSI)
        ("\u202eevil\u202c \u2066x\u2069 \u200f", r"\u202eevil\u202c \u2066x\u2069 \u200f"),
        ("line\u2028para\u2029", r"line\u2028para\u2029"),
        ("\U000e0001tag", r"\U000e0001tag"),
        # The backslash too: the key a\x1b (four characters) never shows as ESC does.
        ("a\\x1b", r"a\\x1b"),
    ],
)
def test_printable_escapes_what_a_terminal_would_act_on(text: str, shown: str) -> None:
    assert display.printable(text) == shown
    assert display.printable(text).isprintable()


def test_shortened_cuts_to_the_width_with_an_ellipsis() -> None:
    assert display.shortened("report", 10) == "report"
    assert display.shortened("x" * 10, 10) == "x" * 10
    assert display.shortened("x" * 11, 10) == "x" * 9 + "…"


def test_a_holder_is_gone_only_where_this_machine_can_tell() -> None:
    from django_tasklock.api.service import new_token
    from django_tasklock.processes import this_machine
    from django_tasklock.testing.cases_dead import dead_token

    acquired = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)

    def held(token: str) -> HeldLock:
        later = acquired + timedelta(minutes=15)
        return HeldLock("k", Holder.from_token(token), acquired, later, 300.0)

    dead, live = held(dead_token()), held(new_token())
    older = held(dead_token().rpartition("/")[0])  # no proof: another version's
    expected = (True, False) if this_machine() is not None else (None, None)
    assert (display.gone(dead), display.gone(live)) == expected
    assert display.gone(older) is None
    assert [display.as_json(lock)["holder_gone"] for lock in (dead, live, older)] == [
        *expected,
        None,
    ]


def test_a_limited_keys_permits_are_one_key_in_their_numbers_order() -> None:
    acquired = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)

    def held(name: str) -> HeldLock:
        return HeldLock(name, Holder("h", 1), acquired, acquired + timedelta(minutes=5), 60.0)

    # As a backend might list them: by name, so permit 10 before permit 2.
    listed = [held(name) for name in ("a", "b\x1f10", "b\x1f2", "c", "b\x1f0")]

    groups = display.by_key(listed)

    assert [(group.key, group.permits, group.limited) for group in groups] == [
        ("a", [], False),
        ("b", [0, 2, 10], True),
        ("c", [], False),
    ]
    assert [lock.key for lock in groups[1].locks] == ["b\x1f0", "b\x1f2", "b\x1f10"]
    assert [display.as_json(lock)["key"] for lock in groups[1].locks] == ["b"] * 3
    assert [display.as_json(lock)["permit"] for lock in listed] == [None, 10, 2, None, 0]
    assert display.named("b", 2) == "permit 2 of 'b'"
    assert display.named("b", None) == "'b'"
    assert display.permits_held(1) == "1 permit held"
    assert display.permits_held(2, 3) == "2 of 3 permits held"
