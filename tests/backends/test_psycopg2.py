"""The database backend on PostgreSQL through psycopg2, Django's driver without psycopg 3."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import services
from tests.support.processes import ROOT, require_module


def test_refresh_through_psycopg2() -> None:
    """The refresh (``SET LOCAL ...; UPDATE ...`` in one query) works on psycopg2 too,
    and the driver tells an open transaction from a committed one."""
    url = os.environ.get(services.POSTGRES_ENV)
    if not url:
        if services.IN_CI:
            pytest.fail(f"CI=true and {services.POSTGRES_ENV} is not set")
        pytest.skip(f"{services.POSTGRES_ENV} is not set")
    require_module("psycopg2")
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.psycopg2_worker", url],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "psycopg2",
        "acquire True",
        "refresh_many [True]",
        "release True",
        "open after a query True",
        "open after the commit False",
    ], done.stderr
