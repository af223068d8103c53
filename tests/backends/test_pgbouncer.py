"""The whole contract suite through PgBouncer in transaction pooling mode.

Behind transaction pooling, each transaction may run on a different server
connection, so anything tied to a session — advisory session locks, as
django-pglock and other libraries use, or prepared statements — is lost
between two statements. Every lock statement here is one autocommit
statement whose effect is a committed row, so it needs no session: this suite
(mutual exclusion across processes, the heartbeat, kill -9 reclaim, lost
locks) proves it. PgBouncer is started by the test settings
(``tests/support/services.py``) on a loopback port in front of the test PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from django_tasklock.testing import BackendContract, ContractBackend
from tests.conftest import database_backend, require_service

pytestmark = pytest.mark.databases


class TestContractThroughPgBouncer(BackendContract):
    @pytest.fixture
    def contract_backend(self) -> ContractBackend:
        require_service("postgres")
        require_service("pgbouncer")
        assert "pgbouncer" in settings.DATABASES
        backend = database_backend("pgbouncer")
        backend.name = "database:pgbouncer"
        return backend


def test_a_process_a_test_starts_uses_the_test_process_pgbouncer() -> None:
    """Not one of its own: a holder or worker a test kills never stops its PgBouncer."""
    require_service("postgres")
    require_service("pgbouncer")
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.DATABASES['pgbouncer']['PORT'])",
        ],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert child.stdout.split()[-1] == settings.DATABASES["pgbouncer"]["PORT"]
