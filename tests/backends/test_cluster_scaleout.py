"""A master added to a running cluster: ``list`` and ``clear_stale`` see its locks.

redis-py's ``RedisCluster`` learns the layout when it connects and again only
after a ``MOVED`` or a connection error; ``SCAN`` goes to the masters it knows.
A long-lived process (the admin's web server) that has not sent a keyed
command to the new master since it joined must still list the locks held
there. A private two-node cluster (no replicas): one master with every slot,
then a second one given one slot, on free loopback ports.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from django_tasklock.backends.base import KEY_PREFIX, storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.slots import SLOTS, key_slot, tag_for
from tests.support.cluster import _free_node_port
from tests.support.servers import require_binary, wait_for_port

TTL = timedelta(minutes=5)


class TwoNodes:
    def __init__(self) -> None:
        self.server = require_binary(shutil.which("redis-server"), "redis-server")
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-scaleout-"))
        self.ports: list[int] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.clients: list[Any] = []

    def start(self) -> int:
        import redis

        port = _free_node_port()
        node_dir = self.dir / str(port)
        node_dir.mkdir()
        command = (
            f"{self.server} --port {port} --bind 127.0.0.1 --cluster-enabled yes"
            f" --cluster-config-file nodes.conf --save '' --appendonly no --dir {node_dir}"
        )
        with open(node_dir / "log", "ab") as log:
            self.processes.append(subprocess.Popen(shlex.split(command), stdout=log, stderr=log))
        wait_for_port(port)
        self.ports.append(port)
        self.clients.append(redis.Redis(port=port, socket_timeout=10))
        return port

    def wait(self, ok: Any, what: str) -> None:
        end = time.monotonic() + 30
        while not ok():
            if time.monotonic() > end:
                raise TimeoutError(f"{what} after 30 s (files in {self.dir})")
            time.sleep(0.1)

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for process in self.processes:
            process.kill()
            process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def two_nodes() -> Iterator[TwoNodes]:
    nodes = TwoNodes()
    try:
        yield nodes
    finally:
        nodes.stop()


def test_list_and_clear_stale_see_a_master_that_joined_after_the_connection(
    two_nodes: TwoNodes, key: str
) -> None:
    from redis.cluster import RedisCluster

    first = two_nodes.start()
    a = two_nodes.clients[0]
    a.execute_command("CLUSTER ADDSLOTSRANGE", 0, SLOTS - 1)
    two_nodes.wait(lambda: a.cluster("info")["cluster_state"] == "ok", "one master not ok")

    old, new = f"{key}-old", f"{key}-new"
    assert key_slot(storage_key(old)) != key_slot(storage_key(new))
    client = RedisCluster(host="127.0.0.1", port=first)
    backend = RedisBackend(client=client)  # a long-lived process: its layout learned now
    assert backend.acquire(old, "t-old", ttl=TTL, max_lifetime=TTL)
    assert [lock.key for lock in backend.list()] == [old]

    # A second master joins and is given the slot of the new key (empty, so no MIGRATE).
    second = two_nodes.start()
    b = two_nodes.clients[1]
    a.execute_command("CLUSTER MEET", "127.0.0.1", second)
    two_nodes.wait(lambda: len(b.cluster("nodes")) == 2, "the second node not met")
    slot = key_slot(storage_key(new))
    b_id = b.execute_command("CLUSTER MYID")
    for node in (a, b):
        node.execute_command("CLUSTER SETSLOT", slot, "NODE", b_id)
    two_nodes.wait(
        lambda: all(n.cluster("info")["cluster_state"] == "ok" for n in (a, b)), "not ok"
    )
    # Another process takes the new key, on the new master.
    other = RedisCluster(host="127.0.0.1", port=second)
    try:
        assert RedisBackend(client=other).acquire(new, "t-new", ttl=TTL, max_lifetime=TTL)
        assert b.exists(storage_key(new))  # on the new master (A would answer MOVED)
        b.set(f"{KEY_PREFIX}{tag_for(storage_key(new))}{key}", "x")  # no TTL: stale, on B

        assert [lock.key for lock in backend.list()] == [new, old]
        assert backend.clear_stale(dry_run=True) == 1
    finally:
        other.close()
        client.close()
