"""A test that hangs fails its run within minutes, with every thread's stack.

Without this, a hung test (a deadlock in a C extension keeping the GIL, say)
holds its xdist worker until CI's own time limit, and nothing says which test
or where. ``faulthandler``'s watchdog is a C thread that needs no GIL: after
``HUNG_AFTER`` seconds in one test (its fixtures included) it writes every
thread's stack to the run's stderr and ends the process, which xdist reports
as a crashed worker, naming the test. ``@pytest.mark.unbounded`` exempts a
test whose length is set by hand (the fault explorer's long size).
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator
from typing import IO, Any

import pytest

#: The longest test takes under 3 minutes on a loaded CI machine.
HUNG_AFTER = float(os.environ.get("TASKLOCK_TEST_HUNG_AFTER") or 900)

_stderr: IO[str] | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _stderr
    config.addinivalue_line(
        "markers", "unbounded: runs as long as it was told to (no hang watchdog)"
    )
    # A copy of the real stderr: while a test runs, pytest's capture points fd 2 elsewhere.
    _stderr = os.fdopen(os.dup(2), "w")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _stderr is not None:
        _stderr.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    stderr = None if item.get_closest_marker("unbounded") else _stderr
    if stderr is not None:
        faulthandler.dump_traceback_later(HUNG_AFTER, exit=True, file=stderr)
    try:
        yield
    finally:
        if stderr is not None:
            faulthandler.cancel_dump_traceback_later()
