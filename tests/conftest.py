from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_tasklock.backends import reset_backend
from django_tasklock.backends.base import caller_key, storage_key
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.connections import add_thread_connection
from django_tasklock.backends.database.functions import UtcNow
from django_tasklock.leases import ticks
from django_tasklock.testing import BackendRecipe, ContractBackend, faketime_worker_clock
from tests.support import services

#: A hung test ends its run within minutes, saying where (tests/support/hangs.py).
pytest_plugins = ["tests.support.hangs"]

#: Every database alias the suite runs against.
DATABASE_ALIASES = [
    alias
    for alias in ("default", "postgres", "pgbouncer", "mariadb")
    if alias in settings.DATABASES
]
BACKENDS = ["sqlite", "postgres", "mariadb", "redis", "memory"]
#: For tests that run ``manage.py check``: on Django 6.1 (not 5.2) its model checks
#: reach every database (a query asks SQLite whether it supports JSONField fields).
runs_manage_py_check = pytest.mark.django_db(databases="__all__")


def pytest_report_header() -> list[str]:
    return [
        f"tasklock services: postgres={'yes' if settings.POSTGRES_URL else 'no'}, "
        f"mariadb={'yes' if settings.MARIADB_URL else 'no'}, "
        f"redis={'yes' if settings.REDIS_URL else 'no'}"
    ]


def require_service(name: str) -> None:
    if name in services.missing:
        pytest.skip(services.missing[name])


def skewed_worker(recipe: BackendRecipe) -> Any:
    """The faketime hook; under CI=true a missing faketime fails instead of skipping."""
    if services.IN_CI and shutil.which("faketime") is None:

        def missing(offset: timedelta) -> Any:
            pytest.fail("CI=true and faketime is not installed (apt-get install faketime)")

        return missing
    return faketime_worker_clock(recipe)


def database_backend(alias: str) -> ContractBackend:
    from django_tasklock.models import CacheEntry

    rows = CacheEntry.objects.using(alias)

    def plant(stored: str, value: str, created_ago: timedelta, expires_in: timedelta) -> None:
        rows.create(
            key=stored,
            value=value,
            created_at=UtcNow() - created_ago,
            expires_at=UtcNow() + expires_in,
        )

    def put_foreign(stored: str) -> None:
        plant(stored, "not a lock", timedelta(hours=2), -timedelta(hours=1))

    def unreachable() -> DatabaseBackend:
        broken = dict(connections[alias].settings_dict)
        if broken["ENGINE"].endswith("sqlite3"):
            broken["NAME"] = "/nonexistent-directory/tasklock.sqlite3"
        else:
            broken["PORT"] = "1"
        add_thread_connection(f"{alias}_unreachable", broken)
        return DatabaseBackend(using=f"{alias}_unreachable")

    settings_dict = dict(connections[alias].settings_dict)
    recipe = BackendRecipe(
        backend="django_tasklock.backends.database.DatabaseBackend",
        kwargs={"using": alias},
        settings={
            "DATABASES": {"default": settings_dict, alias: settings_dict},
            "INSTALLED_APPS": ["django_tasklock"],
        },
    )
    return ContractBackend(
        name=f"database:{connections[alias].vendor}",
        backend=DatabaseBackend(using=alias),
        recipe=recipe,
        plant=plant,
        put_foreign=put_foreign,
        stored_keys=lambda: set(rows.values_list("key", flat=True)),
        unreachable=unreachable,
        # SQLite runs in the worker's process: its clock is the worker's.
        skew_worker_clock=None if alias == "default" else skewed_worker(recipe),
    )


def redis_backend(
    namespace: str, url: str | None = None, name: str = "redis", **options: Any
) -> Iterator[ContractBackend]:
    """The shared test Redis, or the one at ``url``; ``options`` for ``RedisBackend``."""
    import redis

    from django_tasklock.backends.redis import RedisBackend
    from django_tasklock.backends.redis.scripts import RELEASED_PREFIX

    url = url or settings.REDIS_URL
    assert url is not None
    client = redis.Redis.from_url(url)

    def plant(stored: str, value: str, created_ago: timedelta, expires_in: timedelta) -> None:
        seconds, micros = client.time()
        acquired_ms = seconds * 1000 + micros // 1000 - int(created_ago.total_seconds() * 1000)
        client.set(stored, f"{value}@{acquired_ms}", px=int(expires_in.total_seconds() * 1000))

    def put_foreign(stored: str) -> None:
        client.set(stored, "not a lock")

    def written() -> set[str]:
        return {k.decode() for k in client.scan_iter(match=f"*{namespace}*")}

    def stored_keys() -> set[str]:
        # A release's tombstone is no lease: it outlives the lease by design.
        return {k for k in written() if not k.startswith(RELEASED_PREFIX)}

    recipe = BackendRecipe(
        backend="django_tasklock.backends.redis.RedisBackend",
        kwargs={"url": url, **options},
        settings={"INSTALLED_APPS": ["django_tasklock"]},
    )
    backend = RedisBackend(url=url, **options)
    yield ContractBackend(
        name=name,
        backend=backend,
        recipe=recipe,
        plant=plant,
        put_foreign=put_foreign,
        stored_keys=stored_keys,
        unreachable=lambda: RedisBackend(url="redis://127.0.0.1:1/0", **options),
        skew_worker_clock=skewed_worker(recipe),
    )
    try:
        # Only what this test wrote: its keys all carry its namespace.
        for stored in written():
            client.delete(stored)
    finally:
        # Both clients closed, no socket left to the GC: a test whose exception
        # keeps them in a reference cycle would otherwise leave it to whichever
        # later test collects that cycle, failed there by its ResourceWarning.
        client.close()
        if backend.policy_check is not None:
            backend.policy_check.join(10)  # its CONFIG GET may still open a connection
        if backend._client is not None:
            backend._client.close()


def memory_backend() -> ContractBackend:
    from django_tasklock.backends import memory

    backend = memory.MemoryBackend()
    leases = backend._leases  # the suite's own backend: it may look inside

    def plant(stored: str, value: str, created_ago: timedelta, expires_in: timedelta) -> None:
        now = time.monotonic()
        leases[caller_key(stored)] = memory._Lease(
            token=value,
            acquired=now - created_ago.total_seconds(),
            expires=now + expires_in.total_seconds(),
        )

    # No put_foreign: the memory backend keeps leases only, nothing else to protect.
    # No unreachable: there is no storage to lose.
    return ContractBackend(
        name="memory",
        backend=backend,
        plant=plant,
        stored_keys=lambda: {storage_key(key) for key in leases},
    )


@pytest.fixture(params=BACKENDS)
def any_backend(request: pytest.FixtureRequest, key: str) -> Iterator[ContractBackend]:
    """One ContractBackend for each backend, for the contract suite."""
    name: str = request.param
    if name == "sqlite":
        yield database_backend("default")
    elif name == "postgres":
        require_service("postgres")
        yield database_backend("postgres")
    elif name == "mariadb":
        require_service("mariadb")
        yield database_backend("mariadb")
    elif name == "redis":
        require_service("redis")
        yield from redis_backend(key)
    else:
        yield memory_backend()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A private Redis Cluster (3 masters, 3 replicas) for the whole run (support/cluster.py)."""
    from tests.support.cluster import PrivateCluster

    cluster = PrivateCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_backend(redis_cluster: Any, key: str) -> Iterator[ContractBackend]:
    """The Redis backend on the private cluster, by a ``redis+cluster://`` URL."""
    from tests.support.cluster import cluster_contract_backend

    yield from cluster_contract_backend(redis_cluster, key)


@pytest.fixture(scope="session", autouse=True)
def _pgbouncer_lets_go(django_db_setup: None) -> Iterator[None]:
    """Stop PgBouncer, and wait for waiters' listening connections to close, before the
    test databases are dropped: both hold connections to them."""
    yield
    from django_tasklock.backends import listening

    assert listening.wait_closed(30), "a listening connection is still open"
    if "pgbouncer" in services.stoppers:
        services.stoppers["pgbouncer"]()


@pytest.fixture(autouse=True)
def _fresh_backend() -> Iterator[None]:
    """No backend chosen in a test outlives it (deleting a setting sends no signal)."""
    reset_backend()
    yield
    reset_backend()


@pytest.fixture
def no_ticks() -> Iterator[None]:
    """This process's heartbeat ticks and failed refreshes (what W012 and W014
    judge), from none, put back after.

    An earlier test's slow tick (a stalled storage, a suspended clock) still counts
    for two of its intervals, and would otherwise be this test's finding.
    """
    saved = ticks._last, ticks._recent, ticks._unreachable
    ticks._last, ticks._recent, ticks._unreachable = None, (), {}
    try:
        yield
    finally:
        ticks._last, ticks._recent, ticks._unreachable = saved


@pytest.fixture
def key() -> str:
    import uuid

    return f"t-{uuid.uuid4().hex[:12]}"


def pytest_collection_modifyitems(items: list[Any]) -> None:
    # Lock writes must really commit (other threads and processes read them),
    # so tests that touch a database run transactional.
    marker = pytest.mark.django_db(transaction=True, databases=DATABASE_ALIASES)
    for item in items:
        if "any_backend" in getattr(item, "fixturenames", ()) or item.get_closest_marker(
            "databases"
        ):
            item.add_marker(marker)


@pytest.fixture
def active_backend(any_backend: ContractBackend) -> Iterator[ContractBackend]:
    """``any_backend``, made the one ``TASKLOCK_BACKEND`` chooses (for commands and the admin)."""
    from django.test import override_settings

    from django_tasklock import backends

    if any_backend.name == "memory":
        with override_settings(TASKLOCK_BACKEND="memory"):
            backends._backend = any_backend.backend  # the very instance the test plants in
            yield any_backend
    elif any_backend.name == "redis":
        with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL=settings.REDIS_URL):
            yield any_backend
    else:
        assert any_backend.recipe is not None
        alias = any_backend.recipe.kwargs["using"]
        with override_settings(TASKLOCK_BACKEND="database", TASKLOCK_DATABASE=alias):
            yield any_backend
