"""The contract suite (django_tasklock.testing) on SQLite, PostgreSQL, MariaDB, Redis,
Redis Cluster and memory."""

from __future__ import annotations

import pytest

from django_tasklock import BaseBackend, TaskLockService
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.testing import BackendContract, ContractBackend
from django_tasklock.testing.cases_fencing import FencingCases


class TestContract(BackendContract):
    @pytest.fixture
    def contract_backend(self, any_backend: ContractBackend) -> ContractBackend:
        return any_backend


@pytest.mark.slow  # some 45 s: tox's quick runs leave it to the full run
class TestContractOnRedisCluster(BackendContract):
    """The same contract on a private Redis Cluster of 3 masters and 3 replicas."""

    @pytest.fixture
    def contract_backend(self, cluster_backend: ContractBackend) -> ContractBackend:
        return cluster_backend


class NoFences(MemoryBackend):
    """A backend that, like a third party's, leaves fence() unimplemented."""

    fence = BaseBackend.fence


class TestFencingIsOptional(FencingCases):
    """Its fencing cases are skipped, each saying why, rather than failed."""

    @pytest.fixture
    def contract_backend(self) -> ContractBackend:
        return ContractBackend(name="no-fences", backend=NoFences())

    @pytest.fixture
    def service(self, contract_backend: ContractBackend) -> TaskLockService:
        return TaskLockService(contract_backend.backend)

    @pytest.fixture
    def key(self) -> str:
        return "no-fences"
