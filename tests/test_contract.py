"""The contract suite (django_tasklock.testing) on SQLite, PostgreSQL, Redis and memory."""

from __future__ import annotations

import pytest

from django_tasklock.testing import ContractBackend, ProviderContract


class TestContract(ProviderContract):
    @pytest.fixture
    def contract_backend(self, any_backend: ContractBackend) -> ContractBackend:
        return any_backend
