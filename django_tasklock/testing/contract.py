"""The contract every backend honours, as a pytest suite.

It tests what docs/guarantees.md promises under "What you can rely on", items 1 to 12.

Subclass :class:`BackendContract` and give it a ``contract_backend`` fixture
returning a :class:`ContractBackend` for your backend::

    class TestMyBackend(BackendContract):
        @pytest.fixture
        def contract_backend(self):
            return ContractBackend(name="mine", backend=MyBackend(), ...)

Cases that need something a backend cannot offer (another process, a way to
plant raw rows) say so by a capability flag or a missing hook and are skipped
with that reason, never silently.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import BaseBackend
from django_tasklock.signals import lock_acquired, lock_lost, lock_released
from django_tasklock.testing.cases_clock import ClockCases
from django_tasklock.testing.cases_dead import DeadHolderCases
from django_tasklock.testing.cases_exclusion import ExclusionCases
from django_tasklock.testing.cases_failures import FailureCases
from django_tasklock.testing.cases_fencing import FencingCases
from django_tasklock.testing.cases_lease import LeaseCases
from django_tasklock.testing.cases_lock import LockCases
from django_tasklock.testing.cases_operations import OperationCases
from django_tasklock.testing.cases_permits import PermitCases
from django_tasklock.testing.cases_rerun import RerunCases
from django_tasklock.testing.cases_resend import ResendCases
from django_tasklock.testing.support import ContractBackend, SignalRecorder

__all__ = ["BackendContract", "ContractBackend"]


class BackendContract(
    ExclusionCases,
    LeaseCases,
    FailureCases,
    OperationCases,
    ClockCases,
    LockCases,
    FencingCases,
    ResendCases,
    DeadHolderCases,
    PermitCases,
    RerunCases,
):
    """docs/guarantees.md, "What you can rely on", items 1 to 12, against ``contract_backend``."""

    @pytest.fixture
    def contract_backend(self) -> ContractBackend:  # pragma: no cover - subclasses give it
        raise NotImplementedError("define a contract_backend fixture")

    @pytest.fixture
    def backend(self, contract_backend: ContractBackend) -> BaseBackend:
        return contract_backend.backend

    @pytest.fixture
    def service(self, backend: BaseBackend) -> TaskLockService:
        return TaskLockService(backend)

    @pytest.fixture
    def key(self) -> str:
        return f"contract-{uuid.uuid4().hex[:12]}"

    @pytest.fixture
    def signals(self) -> Iterator[SignalRecorder]:
        recorder = SignalRecorder()
        for sig in (lock_acquired, lock_released, lock_lost):
            sig.connect(recorder, weak=False)
        yield recorder
        for sig in (lock_acquired, lock_released, lock_lost):
            sig.disconnect(recorder)
