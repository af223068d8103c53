"""Test helpers for projects and third-party backends.

``ProviderContract`` is the contract suite (SPEC §3) as a pytest class to
subclass; ``ContractBackend`` describes the provider under test;
``ProviderRecipe`` rebuilds it in another process. Importing this module
needs pytest.
"""

from __future__ import annotations

from django_tasklock.testing.contract import ProviderContract
from django_tasklock.testing.faults import FaultyProvider, InjectedFault
from django_tasklock.testing.support import ContractBackend
from django_tasklock.testing.workers import ProviderRecipe

__all__ = [
    "ContractBackend",
    "FaultyProvider",
    "InjectedFault",
    "ProviderContract",
    "ProviderRecipe",
]
