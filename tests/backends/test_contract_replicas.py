"""The whole contract suite on Redis with replica acknowledgement on (``min_replicas=1``).

A private master and its replica (``tests/support/replication.py``): every
acquisition and fence of the suite waits for the replica, and every
guarantee holds as it does without the wait.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_tasklock.testing import BackendContract, ContractBackend
from tests.conftest import redis_backend
from tests.support.replication import master_and_replica
from tests.support.servers import PrivateRedis

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def master() -> Iterator[PrivateRedis]:
    with master_and_replica() as (running, _replica):
        yield running


class TestContractWithReplicaAcknowledgement(BackendContract):
    @pytest.fixture
    def contract_backend(self, master: PrivateRedis, key: str) -> Iterator[ContractBackend]:
        yield from redis_backend(key, master.url, "redis-replicas", min_replicas=1)
