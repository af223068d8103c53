"""How two readings of a storage's clock say it stepped (``leases/storage_clock.py``)."""

from __future__ import annotations

import gc
import logging
import time

import pytest

from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.leases.storage_clock import (
    RATE_TOLERANCE,
    STEP_TOLERANCE,
    Reading,
    StorageClocks,
    _step,
)


def test_a_clock_that_kept_time_did_not_step() -> None:
    # 10 s here between the two readings, each taking 0.1 s; the storage read 10.05 s.
    assert _step(Reading(0.0, 0.1, 1000.0), Reading(10.0, 10.1, 1010.05), "x") == 0.0


def test_a_reading_that_took_long_is_no_step() -> None:
    # The second reading was answered 3 s after it was sent (a loaded server): its
    # clock may have been read anywhere in those 3 s.
    assert _step(Reading(0.0, 0.1, 1000.0), Reading(10.0, 13.0, 1012.9), "x") == 0.0


def test_a_step_forward_is_measured_by_its_most(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="django_tasklock"):
        step = _step(Reading(0.0, 0.1, 1000.0), Reading(10.0, 10.1, 1040.0), "Redis")
    # 40 s on the storage while 9.9 to 10.1 s passed here: a step of 29.9 to 30.1 s.
    assert step == pytest.approx(30.1)
    assert "stepped forward by 29.900 s to 30.100 s" in caplog.text
    assert "Redis" in caplog.text


def test_the_tolerance_grows_with_the_time_between_readings() -> None:
    hour = 3600.0
    drift = STEP_TOLERANCE + RATE_TOLERANCE * hour
    before = Reading(0.0, 0.0, 0.0)
    assert _step(before, Reading(hour, hour, hour + drift * 0.9), "x") == 0.0
    assert _step(before, Reading(hour, hour, hour + drift * 1.1), "x") > 0


def test_a_step_back_is_logged_and_not_acted_on(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="django_tasklock"):
        assert _step(Reading(0.0, 0.1, 1000.0), Reading(10.0, 10.1, 980.0), "x") == 0.0
    assert "stepped back by at least" in caplog.text


def test_a_backend_without_a_clock_is_never_judged() -> None:
    clocks = StorageClocks()
    backend = MemoryBackend()
    assert not clocks.known(backend)
    assert clocks.look(backend) == 0.0
    assert clocks.known(backend)  # looked at: not looked at again when a lease comes
    assert clocks.look(backend) == 0.0


class _Failing(MemoryBackend):
    def storage_time(self) -> float | None:
        raise ConnectionError("down")


class _Flaky(MemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.readings: list[float | None] = []

    def storage_time(self) -> float | None:
        reading = self.readings.pop(0)
        if reading is None:
            raise ConnectionError("down")
        return reading


def test_a_reading_that_fails_is_no_step_and_keeps_the_last() -> None:
    clocks = StorageClocks()
    assert clocks.look(_Failing()) == 0.0
    backend = _Flaky()
    now = time.time()
    # A reading, a failure, then a reading 100 s ahead of the first: the step is
    # judged against the last good reading.
    backend.readings = [now, None, now + 100]
    assert clocks.look(backend) == 0.0
    assert clocks.look(backend) == 0.0
    assert clocks.look(backend) > 90


def test_a_backend_dropped_is_forgotten() -> None:
    clocks = StorageClocks()
    backend = MemoryBackend()
    clocks.look(backend)
    del backend
    gc.collect()
    assert len(clocks._last) == 0
