"""A private Redis master with one replica, for the replica acknowledgement tests.

Both are ``tests/support/servers.py`` servers (free loopback ports, files in a
temporary directory, no persistence). The master syncs a new replica through
a file (``repl-diskless-sync no``): it counts the replica as soon as the file
is sent, where a diskless sync waits for the replica's first acknowledgement,
sent once a second. A failover trial starts a fresh pair in tens of
milliseconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis

from django_tasklock.backends.redis import RedisBackend
from tests.support.servers import PrivateRedis, private_redis

Closable = TypeVar("Closable")

MASTER_OPTIONS = ("--repl-diskless-sync", "no")


def replica_of(master: PrivateRedis) -> tuple[str, ...]:
    return (*MASTER_OPTIONS, "--replicaof", "127.0.0.1", str(master.port))


def wait_until_in_sync(master: PrivateRedis, timeout: float = 20) -> None:
    """Until a write on the master is acknowledged by a replica (``WAIT``).

    A replica whose link is up may not be counted yet: after a diskless sync
    the master waits for its first acknowledgement, sent once a second.
    """
    client: Any = redis.Redis(port=master.port, single_connection_client=True)
    end = time.monotonic() + timeout
    with contextlib.closing(client):
        while True:
            client.incr("tasklock-test-sync")
            if client.wait(1, 100) >= 1:
                return
            if time.monotonic() > end:
                raise TimeoutError(f"no replica of {master.port} acknowledged a write")


@contextlib.contextmanager
def master_and_replica() -> Iterator[tuple[PrivateRedis, PrivateRedis]]:
    with private_redis(*MASTER_OPTIONS) as master, private_redis(*replica_of(master)) as replica:
        wait_until_in_sync(master)
        yield master, replica


@contextlib.contextmanager
def frozen(server: PrivateRedis) -> Iterator[None]:
    """``SIGSTOP`` the server: its connections stay open, it answers nothing."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def close(thing: Any) -> None:
    """Close a redis-py client, or the client a ``RedisBackend`` made (if it made one)."""
    client = thing._client if isinstance(thing, RedisBackend) else thing
    if client is not None:
        client.close()


@pytest.fixture
def closing() -> Iterator[Callable[[Closable], Closable]]:
    """``closing(client_or_backend)``: closed when the test ends (no socket left to the GC)."""
    opened: list[Any] = []

    def register(thing: Closable) -> Closable:
        opened.append(thing)
        return thing

    yield register
    for thing in opened:
        close(thing)


@dataclasses.dataclass
class Trial:
    """One failover trial: the grants made around it and how many were granted twice."""

    granted: int = 0
    doubled: int = 0


def summary(results: list[Trial]) -> str:
    """One line for a run of trials, for the test's output."""
    granted = sum(r.granted for r in results)
    doubled = sum(r.doubled for r in results)
    hit = sum(1 for r in results if r.doubled)
    return (
        f"{len(results)} trials, {granted} grants, {doubled} granted twice "
        f"({doubled / max(granted, 1):.3%}), in {hit} trials"
    )
