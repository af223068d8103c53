"""Huey's own lock tests, from the Huey release installed, against ``contrib.huey``.

Each case is a test method of ``huey/tests/test_api.py`` (shipped in Huey's
wheel), run unchanged by unittest on a ``MemoryHuey`` that
``django_tasklock.contrib.huey.install`` gave our ``lock_task``,
``is_locked`` and ``flush_locks``, with its locks in each backend. Their lock
names are fixed (``lock_a``, ``lock1``): on Redis a private server, so that
other test workers' runs of the same names never meet them.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_tasklock.api.service import TaskLockService
from django_tasklock.testing import ContractBackend
from tests.conftest import database_backend, memory_backend, redis_backend, require_service
from tests.support.servers import private_redis

pytest.importorskip("huey")
from huey.api import MemoryHuey

from django_tasklock.contrib.huey import install


def _hueys_test_api() -> types.ModuleType:
    """``huey.tests.test_api``, without ``huey/tests/__init__.py``: that imports
    every test module of Huey's, one of which configures Django settings."""
    if "huey.tests" not in sys.modules:
        spec = importlib.util.find_spec("huey")
        assert spec is not None
        assert spec.origin is not None
        folder = Path(spec.origin).parent / "tests"
        if not (folder / "test_api.py").exists():
            pytest.skip("this Huey release does not ship its tests", allow_module_level=True)
        package = types.ModuleType("huey.tests")
        package.__path__ = [str(folder)]
        sys.modules["huey.tests"] = package
    return importlib.import_module("huey.tests.test_api")


test_api = _hueys_test_api()

pytestmark = pytest.mark.databases

#: (class, method) of every test in Huey's test_api.py that takes, reads or flushes a lock.
HUEY_LOCK_TESTS = [
    ("TestTaskLocking", "test_task_locking"),
    ("TestHueyAPIs", "test_flush_locks"),
    ("TestHueyAPIs", "test_flush_named_locks"),
    ("TestQueue", "test_retrying_exceptions_not_surfaced"),
]


@pytest.fixture(params=["sqlite", "postgres", "mariadb", "redis", "memory"])
def storage(request: pytest.FixtureRequest) -> Iterator[ContractBackend]:
    name: str = request.param
    if name in ("postgres", "mariadb"):
        require_service(name)
        yield database_backend(name)
    elif name == "sqlite":
        yield database_backend("default")
    elif name == "redis":
        require_service("redis")
        with private_redis() as server:
            yield from redis_backend("", url=server.url)
    else:
        yield memory_backend()


def test_every_lock_test_of_huey_is_run() -> None:
    """A Huey release that renames or adds a lock test is noticed here."""
    calls = ("lock_task(", "is_locked(", "flush_locks(")
    found = {
        (name, method)
        for name, case in vars(test_api).items()
        if isinstance(case, type) and issubclass(case, unittest.TestCase)
        for method in vars(case)
        if method.startswith("test_")
        and any(call in inspect.getsource(getattr(case, method)) for call in calls)
    }
    assert found == set(HUEY_LOCK_TESTS)


@pytest.mark.parametrize(("case", "method"), HUEY_LOCK_TESTS)
def test_hueys_own_lock_test_passes(storage: ContractBackend, case: str, method: str) -> None:
    service = TaskLockService(storage.backend)
    installed: list[Any] = []

    def get_huey(self: unittest.TestCase) -> MemoryHuey:
        huey = MemoryHuey(utc=False)
        install(huey, service=service)
        installed.append(huey)
        return huey

    ours = type(case, (getattr(test_api, case),), {"get_huey": get_huey})
    result = unittest.TestResult()
    ours(method).run(result)
    assert installed, "the test did not make its Huey"
    problems = [text for _, text in result.errors + result.failures]
    assert not problems, "\n".join(problems)
    assert result.testsRun == 1
    assert not result.skipped
