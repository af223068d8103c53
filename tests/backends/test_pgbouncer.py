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
