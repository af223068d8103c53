"""Test helpers for projects and third-party backends.

``BackendContract`` is the contract suite (docs/guarantees.md, "What you can rely
on") as a pytest class to subclass; ``ContractBackend`` describes the
backend under test; ``BackendRecipe`` rebuilds it in another process.
Importing this module needs pytest.
"""

from __future__ import annotations

from django_tasklock.testing.contract import BackendContract
from django_tasklock.testing.faults import FaultyBackend, InjectedFault
from django_tasklock.testing.skew import faketime_worker_clock
from django_tasklock.testing.support import ContractBackend
from django_tasklock.testing.workers import BackendRecipe

__all__ = [
    "BackendContract",
    "BackendRecipe",
    "ContractBackend",
    "FaultyBackend",
    "InjectedFault",
    "faketime_worker_clock",
]
