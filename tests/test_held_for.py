"""One "held for": the admin page, ``manage.py tasklock list`` and the health check agree.

Each shows :func:`django_tasklock.display.seconds_held` (by the storage's
clock), on every backend.
"""

from __future__ import annotations

import io
import json
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from django_tasklock import display, health
from django_tasklock.backends.base import storage_key
from django_tasklock.service import new_token
from django_tasklock.testing import ContractBackend

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
