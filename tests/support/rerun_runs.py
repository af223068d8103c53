"""``on_locked="rerun"`` with real task-framework workers: 20 triggers during one run.

The scenario (:func:`twenty_triggers`), the same for every framework: a job
(its argument ``n`` 0) holds the key and waits; 20 more jobs of the same key
are sent (``n`` 1 to 20), each after the test wrote the change it announces
(a counter in a file, 1 to 20); all 20 are skipped and mark the key; the
holder is let go. Exactly one more run must follow, after the first run
ended, having read the counter's final value; no two runs at once. Where the
framework's integration sends a skipped call once more (``sent_again``),
that run is the last skipped job's (``n`` 20 when the jobs ran in the order
sent), in any worker; elsewhere the
holder runs its own work again (``n`` 0), in its worker.

The job side: the framework's job calls :func:`job` with a function
decorated ``@exclusive(key, on_locked="rerun")`` that calls :func:`body`.
Every file a job writes is written whole (``framework_runs._write``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.framework_runs import _write

TRIGGERS = 20
PATIENCE = 120.0  # a generous bound for a condition, never a pause


def body(signals: str, worker: int, n: int) -> bool:
    """The locked work: note the counter it starts from, and its job's ``n``; the first
    run waits for ``go``."""
    folder = Path(signals)
    entry = time.time()  # read after the lock was granted
    seen = int((folder / "counter").read_text())
    if not (folder / "started").exists():
        (folder / "started").touch()
        deadline = time.monotonic() + PATIENCE
        while not (folder / "go").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never let the first run go")
            time.sleep(0.01)
    _write(folder, ".ran", f"{entry} {time.time()} {worker} {seen} {n}")
    return True


def job(locked: Callable[[str, int, int], Any], signals: str, worker: int, n: int) -> None:
    """The job: the locked function, and a note of how its call ended (``.skipped``/``.done``)."""
    if locked(signals, worker, n) is None:  # skipped: the key marked by now
        _write(Path(signals), ".skipped", f"{time.time()} {n}")
    else:
        _write(Path(signals), ".done", str(worker))


def _await(folder: Path, suffix: str, count: int) -> list[str]:
    deadline = time.monotonic() + PATIENCE
    while len(found := sorted(folder.glob(f"*{suffix}"))) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(found)} of {count} {suffix} files after {PATIENCE} s")
        time.sleep(0.02)
    return [path.read_text() for path in found]


def twenty_triggers(
    send: Callable[[int], None], folder: Path, *, sent_again: bool = False
) -> None:
    """The scenario: ``send(n)`` enqueues job ``n`` of the key, writing to ``folder``."""
    (folder / "counter").write_text("0")
    send(0)  # the holder
    _await(folder, "started", 1)
    for change in range(1, TRIGGERS + 1):
        (folder / "counter").write_text(str(change))  # the change its trigger announces
        send(change)
    skipped = sorted(
        tuple(map(float, text.split())) for text in _await(folder, ".skipped", TRIGGERS)
    )
    (folder / "go").touch()
    # Every call that ran has returned (the holder's; and the one sent again): all runs written.
    _await(folder, ".done", 2 if sent_again else 1)
    runs = sorted(tuple(map(float, text.split())) for text in _await(folder, ".ran", 2))
    assert len(runs) == 2, f"{len(runs)} runs: one, then exactly one more"
    (_, first_exit, first_worker, first_seen, first_n) = runs[0]
    (second_entry, _, second_worker, second_seen, second_n) = runs[1]
    assert (first_seen, first_n) == (0, 0)
    assert second_seen == TRIGGERS, "the run once more saw every change made before a trigger"
    assert second_entry >= first_exit, "the run once more started after the first ended"
    if sent_again:
        # The last call skipped, which is not always the last sent: a framework may run
        # its jobs out of order (django-q2's ORM broker takes them with no ORDER BY).
        order = [int(n) for _, n in skipped]
        assert sorted(order) == list(range(1, TRIGGERS + 1))
        assert second_n == order[-1], f"the last skipped call sent again (skipped: {order})"
    else:
        assert second_n == 0, "the holder ran its own work again"
        assert second_worker == first_worker, "run once more by the holder's worker"
    assert len(list(folder.glob("*.skipped"))) == TRIGGERS
