"""The contract suite (django_tasklock.testing) on SQLite, PostgreSQL, MariaDB, Redis, memory."""

from __future__ import annotations

import pytest

from django_tasklock.testing import BackendContract, ContractBackend


class TestContract(BackendContract):
    @pytest.fixture
    def contract_backend(self, any_backend: ContractBackend) -> ContractBackend:
        return any_backend
