"""The heartbeat's heap: leases put back and taken off in bulk come due in order.

Leases refreshed together are put back at one time and come due together:
the heartbeat puts them back as one entry, and takes them off in one pass,
instead of a push and a pop each. Whichever way, they must come off in the
order of their due times (then of their scheduling), as one pop each would give.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

from django_tasklock.leases.heartbeat import _SPLIT_AT, Heartbeat


@dataclass(eq=False)
class Due:
    """What the heap reads of a lease."""

    next_due: float
    pending: Any = None
    closed: bool = False

    def wake_at(self) -> float:
        return self.next_due if self.pending is None else 0.5


@pytest.mark.parametrize("size", [3, _SPLIT_AT, 4 * _SPLIT_AT])
def test_leases_come_off_in_the_order_popping_gives(size: int) -> None:
    beat = Heartbeat()
    rng = random.Random(size)
    scheduled: list[tuple[float, int, Due]] = []  # (when, order scheduled, lease)
    order = 0
    now = 0.0
    for _ in range(30):
        # One batch at one time after every other (as a tick's), or at times scattered.
        if rng.random() < 0.5:
            when = now + rng.choice([1.0, 2.0])
            batch = [Due(when) for _ in range(rng.randint(1, size))]
        else:
            batch = [Due(now + rng.uniform(0, 3)) for _ in range(rng.randint(1, size))]
        beat._schedule(batch)  # type: ignore[arg-type]
        for lease in batch:
            scheduled.append((lease.next_due, order, lease))
            order += 1
        now += rng.uniform(0, 1.5)
        taken = beat._take(now)
        expected = sorted(entry for entry in scheduled if entry[0] <= now)
        assert [id(x) for x in taken] == [id(entry[2]) for entry in expected]
        scheduled = [entry for entry in scheduled if entry[0] > now]
        assert sorted(id(x) for x in _queued(beat)) == sorted(id(entry[2]) for entry in scheduled)
        assert beat._size == len(scheduled)
        assert all(entry[0] <= beat._latest for entry in beat._heap)
        # Each entry's leases are due at its time.
        assert all(x.next_due == when for when, _, group in beat._heap for x in group)
    assert [id(x) for x in beat._take(float("inf"))] == [id(e[2]) for e in sorted(scheduled)]
    assert beat._heap == []
    assert beat._size == 0


def _queued(beat: Heartbeat) -> list[Any]:
    return [x for _, _, group in beat._heap for x in group]


def test_leases_due_at_one_time_go_back_as_one_entry() -> None:
    beat = Heartbeat()
    leases = [Due(5.0) for _ in range(1000)]
    beat._schedule(leases)  # type: ignore[arg-type]
    beat._schedule([Due(7.0), Due(6.0), Due(7.0)])  # type: ignore[list-item]
    assert sorted((when, len(group)) for when, _, group in beat._heap) == [
        (5.0, 1000),
        (6.0, 1),
        (7.0, 2),
    ]
    assert beat._size == 1003


def test_closed_leases_are_not_put_back() -> None:
    beat = Heartbeat()
    leases = [Due(1.0) for _ in range(2 * _SPLIT_AT)]
    for lease in leases[::2]:
        lease.closed = True
    beat._schedule(leases)  # type: ignore[arg-type]
    assert [id(x) for x in beat._take(1.0)] == [id(x) for x in leases[1::2]]


def test_a_lease_watched_leaves_its_group_for_an_entry_of_its_own() -> None:
    beat = Heartbeat()
    leases = [Due(5.0) for _ in range(3)]
    beat._schedule(leases)  # type: ignore[arg-type]
    beat.watch(leases[1], pending=object())  # type: ignore[arg-type]
    assert [(when, [id(x) for x in group]) for when, _, group in sorted(beat._heap)] == [
        (0.5, [id(leases[1])]),
        (5.0, [id(leases[0]), id(leases[2])]),
    ]
    assert [id(x) for x in beat._take(1.0)] == [id(leases[1])]
    assert beat._size == 2


def test_compacting_keeps_the_open_leases_of_a_group() -> None:
    beat = Heartbeat()
    leases = [Due(5.0) for _ in range(6)]
    beat._schedule(leases)  # type: ignore[arg-type]
    beat._schedule([Due(6.0)])  # type: ignore[list-item]
    for lease in leases[::2]:
        lease.closed = True
    beat._heap[-1][2][0].closed = True
    beat._compact()
    assert [[id(x) for x in group] for _, _, group in beat._heap] == [
        [id(x) for x in leases[1::2]]
    ]
    assert beat._size == 3
