"""One "held for": the admin page, ``manage.py tasklock list`` and the health check agree.

Each shows :func:`django_tasklock.ops.display.seconds_held` (by the storage's
clock), on every backend; ``tasklock.hold.duration`` counts from the same grant.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from django_tasklock import TaskLockService
from django_tasklock.api.service import new_token
from django_tasklock.backends.base import storage_key
from django_tasklock.ops import display, health
from django_tasklock.signals import lock_acquired
from django_tasklock.testing import ContractBackend
from tests.support.otel_support import Telemetry, observed

HELD = timedelta(hours=2, minutes=3, seconds=30)  # 30 s from a change of the minute shown


def _tasklock(*args: str) -> str:
    out = io.StringIO()
    call_command("tasklock", *args, stdout=out)
    return out.getvalue()


def test_admin_list_json_and_health_show_the_same_held_for(
    active_backend: ContractBackend, key: str
) -> None:
    assert active_backend.plant is not None
    active_backend.plant(storage_key(key), new_token(), HELD, timedelta(minutes=10))

    root = User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(root)
    page = client.get("/admin/django_tasklock/cacheentry/", {"q": key}).content.decode()
    [admin] = re.findall(r'<td class="field-held">([^<]*)</td>', page)

    [_, row] = _tasklock("list", "--prefix", key).splitlines()
    table = re.split(r"\s{2,}", row)[5]  # KEY HOST PID ACQUIRED EXPIRES HELD LEFT
    [listed] = json.loads(_tasklock("list", "--json", "--prefix", key))
    [finding] = health.lease_findings(active_backend.backend.list(), health.limits({key: 60}))

    assert admin == table == "2 h 03 min"
    assert display.duration(listed["seconds_held"]) == display.duration(finding.seconds) == admin
    assert finding.seconds == pytest.approx(listed["seconds_held"], abs=5)
    assert finding.seconds == pytest.approx(HELD.total_seconds(), abs=25)


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    yield from observed()


def test_hold_duration_is_the_held_for_shown_at_the_release(
    any_backend: ContractBackend, telemetry: Telemetry, key: str
) -> None:
    """Held about a second, half of it in a ``lock_acquired`` receiver (the storage
    has granted the lease by then): ``tasklock.hold.duration``, by the holder's clock
    to the release, is the "held for" read by the storage's clock just before it,
    plus the trips to the storage (a generous bound here: the relation, not a speed)."""

    def slow_receiver(**kwargs: Any) -> None:
        time.sleep(0.5)

    lock_acquired.connect(slow_receiver, weak=False)
    try:
        with TaskLockService(any_backend.backend).lock(key, name="report"):
            time.sleep(0.5)
            [held] = [lock for lock in any_backend.backend.list() if lock.key == key]
            seconds_held = display.seconds_held(held)
    finally:
        lock_acquired.disconnect(slow_receiver)
    [duration] = telemetry.points("tasklock.hold.duration").values()
    assert duration.count == 1
    assert seconds_held >= 0.9
    # Not shorter (the storage's clock, to a millisecond: its timestamps' precision).
    assert duration.sum >= seconds_held - 0.01
    assert duration.sum <= seconds_held + 0.5
