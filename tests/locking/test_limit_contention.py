"""``limit=3`` under contention, through the lock API: never more than 3 bodies at once.

8 processes run 200 rounds each of ``run_exclusive(key, body, limit=3)``
against one key, on every storage that serves several processes (SQLite,
PostgreSQL, MariaDB, Redis, Redis Cluster, Redis through Sentinel); the
memory backend serves one process, so there 8 threads do the same. The
bodies' own start and end times (the host's monotonic clock) must never
show more than 3 running at one instant, and must show 3 at times: the
permits are used, not only never over-given.

The same with a holder SIGKILLed in its body (its permit is taken over at
once, its holder provably gone, though its ttl is 60 s: the others reach 3
again; every storage but memory, whose holders are threads), and with
replies dropped at random through fault proxies (PostgreSQL, MariaDB, Redis
single, and Redis Cluster with a proxy before each node; SQLite and memory
have no wire, and a Sentinel client's lease traffic is a single server's,
reached at the address the sentinel names).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_tasklock.testing import ContractBackend
from django_tasklock.testing.proxy import FaultProxy
from django_tasklock.testing.support import cross_process_recipe
from django_tasklock.testing.workers import BackendRecipe
from tests.support.limited_workers import Report, contend_limited, hold_permit_until_killed

pytestmark = [pytest.mark.slow, pytest.mark.databases]

LIMIT, PROCESSES, ROUNDS, HOLD = 3, 8, 200, 0.03
#: A generous bound for a condition on a loaded machine; never a pause.
PATIENCE = 180


def most_at_once(holds: list[tuple[float, float]]) -> list[tuple[float, int]]:
    """How many holds ran from each start on: (instant, how many), in time order.

    At one instant an end comes before a start: touching intervals are not two at once.
    """
    edges = sorted([(start, 1) for start, _ in holds] + [(end, -1) for _, end in holds])
    running, counts = 0, []
    for instant, step in edges:
        running += step
        counts.append((instant, running))
    return counts


def contend(recipe: BackendRecipe, key: str) -> list[Report]:
    """8 spawned processes x 200 rounds of ``contend_limited``; their reports."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    args = (recipe.build, key, LIMIT, ROUNDS, HOLD, barrier, results)
    procs = [ctx.Process(target=contend_limited, args=args) for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    try:
        return [results.get(timeout=PATIENCE) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def check(holds: list[tuple[float, float]], since: float = 0.0) -> None:
    """Never more than LIMIT at once; exactly LIMIT at some instant after ``since``."""
    counts = most_at_once(holds)
    most = max(n for _, n in counts)
    assert most <= LIMIT, f"{most} bodies ran at once with limit={LIMIT}"
    after = [n for at, n in counts if at > since]
    assert LIMIT in after, f"never 3 at once: at most {max(after)}, {len(holds)} holds"


def test_eight_processes_never_run_more_bodies_than_the_limit(
    any_backend: ContractBackend, key: str
) -> None:
    if any_backend.name == "memory":
        holds = threads_contend(any_backend, key)
    else:
        reports = contend(cross_process_recipe(any_backend), key)
        holds = [hold for _, held, _, _ in reports for hold in held]
        assert sum(refused for _, _, refused, _ in reports) > 0, "there was no contention"
        assert sum(errors for _, _, _, errors in reports) == 0
    check(holds)
    assert len(holds) >= 100


def threads_contend(subject: ContractBackend, key: str) -> list[tuple[float, float]]:
    """The memory backend's case: 8 threads in this process, as the processes would."""
    import queue

    barrier, results = threading.Barrier(PROCESSES), queue.Queue[Report]()
    args = (lambda: subject.backend, key, LIMIT, ROUNDS, HOLD, barrier, results)
    threads = [threading.Thread(target=contend_limited, args=args) for _ in range(PROCESSES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE)
    assert not any(thread.is_alive() for thread in threads)
    reports = [results.get_nowait() for _ in threads]
    return [hold for _, held, _, _ in reports for hold in held]


def test_a_killed_holders_permit_is_taken_over_and_the_limit_still_holds(
    any_backend: ContractBackend, key: str
) -> None:
    recipe = cross_process_recipe(any_backend)  # memory: one process, skipped
    if not any_backend.backend.capabilities.dead_holders:
        pytest.skip(f"{any_backend.name}: no dead-holder takeover")
    killed_then_contended(recipe, key)


def killed_then_contended(recipe: BackendRecipe, key: str) -> None:
    """A holder SIGKILLed in its body (ttl 60 s), then :func:`contend`: 3 at once again."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    victim = ctx.Process(target=hold_permit_until_killed, args=(recipe, key, LIMIT, child))
    victim.start()
    try:
        assert parent.poll(PATIENCE), "the victim never took its permit"
        message, began = parent.recv()
        assert message == "began", (message, began)
        os.kill(victim.pid or 0, signal.SIGKILL)
        victim.join(30)
        killed = time.monotonic()
    finally:
        if victim.is_alive():
            victim.kill()
    reports = contend(recipe, key)
    holds = [(began, killed)] + [hold for _, held, _, _ in reports for hold in held]
    # Three at once after the kill: the dead holder's permit (ttl 60 s) was taken over.
    check(holds, since=killed)


@pytest.fixture(params=["postgres", "mariadb", "redis"])
def through_a_proxy(request: pytest.FixtureRequest) -> Iterator[tuple[BackendRecipe, FaultProxy]]:
    """A recipe whose every connection goes through a proxy that drops 2 % of replies."""
    from django.conf import settings
    from django.db import connections

    from tests.support.proxied import upstream

    name: str = request.param
    with FaultProxy(upstream(name), lifetime=PATIENCE * 2, max_connections=256) as proxy:
        if name == "redis":
            from urllib.parse import urlsplit

            assert settings.REDIS_URL is not None
            db = urlsplit(settings.REDIS_URL).path.strip("/") or "0"
            recipe = redis_recipe(f"redis://{proxy.host}:{proxy.port}/{db}")
        else:
            database = {
                **connections[name].settings_dict,
                "HOST": proxy.host,
                "PORT": str(proxy.port),
            }
            recipe = BackendRecipe(
                backend="django_tasklock.backends.database.DatabaseBackend",
                kwargs={"using": name},
                settings={
                    "DATABASES": {"default": database, name: database},
                    "INSTALLED_APPS": ["django_tasklock"],
                },
            )
        proxy.drop_reply(times=None, probability=0.02)
        yield recipe, proxy


def test_replies_dropped_at_random_never_let_more_bodies_run_than_the_limit(
    through_a_proxy: tuple[BackendRecipe, FaultProxy], key: str
) -> None:
    recipe, proxy = through_a_proxy
    reports = contend(recipe, key)
    holds = [hold for _, held, _, _ in reports for hold in held]
    assert proxy.dropped > 0, "no reply was dropped"
    check(holds)


@pytest.fixture(params=["cluster", "sentinel"])
def other_redis(request: pytest.FixtureRequest) -> Iterator[BackendRecipe]:
    """Redis Cluster (3 masters) and Redis through Sentinel, by their URLs."""
    from tests.support.servers import private_sentinel

    if request.param == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        yield redis_recipe(cluster.url)
        return
    with private_sentinel() as sentinel:
        yield redis_recipe(sentinel.url)


def redis_recipe(url: str) -> BackendRecipe:
    return BackendRecipe(
        backend="django_tasklock.backends.redis.RedisBackend",
        kwargs={"url": url},
        settings={"INSTALLED_APPS": ["django_tasklock"]},
    )


def test_on_redis_cluster_and_sentinel_too(other_redis: BackendRecipe, key: str) -> None:
    reports = contend(other_redis, key)
    holds = [hold for _, held, _, _ in reports for hold in held]
    assert sum(errors for _, _, _, errors in reports) == 0
    check(holds)


def test_on_redis_cluster_and_sentinel_a_killed_holders_permit_is_taken_over(
    other_redis: BackendRecipe, key: str
) -> None:
    killed_then_contended(other_redis, key)


def test_replies_dropped_on_redis_cluster_never_let_more_bodies_run_than_the_limit(
    redis_cluster: Any, key: str
) -> None:
    """A proxy before each of the cluster's nodes (the client maps the nodes' addresses to
    them), each dropping 2 % of replies."""
    with contextlib.ExitStack() as stack:
        proxies = [
            stack.enter_context(
                FaultProxy(("127.0.0.1", port), lifetime=PATIENCE * 2, max_connections=256)
            )
            for port in redis_cluster.ports
        ]
        ports = [proxy.port for proxy in proxies]
        recipe = BackendRecipe(
            backend="tests.support.limited_workers.cluster_through",
            kwargs={"ports": dict(zip(redis_cluster.ports, ports, strict=True))},
            settings={"INSTALLED_APPS": ["django_tasklock"]},
        )
        for proxy in proxies:
            proxy.drop_reply(times=None, probability=0.02)
        reports = contend(recipe, key)
        assert sum(proxy.dropped for proxy in proxies) > 0, "no reply was dropped"
    check([hold for _, held, _, _ in reports for hold in held])
