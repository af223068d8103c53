"""The private test cluster's nodes (``tests/support/cluster.py``) each get ports of their own.

A port chosen twice for one cluster: its second node's server could not bind,
the first one answered in its place, and the cluster was created with five
servers for six nodes. It never became ok, and every cluster test of that
run's worker failed at setup after 60 s (a local CI run's tox step). The
first server was left running after the run: its view was 3 masters and 2
replicas, one of them itself.
"""

from __future__ import annotations

import random
import shutil
import socket
from collections.abc import Callable, Iterator

import pytest

from tests.support import cluster
from tests.support.cluster import NodeDidNotStart, PrivateCluster


@pytest.fixture
def private_cluster() -> Iterator[Callable[[], PrivateCluster]]:
    made: list[PrivateCluster] = []

    def make() -> PrivateCluster:
        made.append(PrivateCluster())
        return made[-1]

    yield make
    for each in made:
        each.stop()
        shutil.rmtree(each.dir, ignore_errors=True)


def test_no_two_nodes_share_a_port_or_a_bus_port(
    private_cluster: Callable[[], PrivateCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The random choice offers a port again, and a port that is another's bus port
    # (+10000), or whose bus port is another's port.
    offered = iter([22100, 22100, 12100, 12000, 22000, 13000, 14000, 15000, 16000])
    monkeypatch.setattr(random, "randrange", lambda *_: next(offered))
    monkeypatch.setattr(cluster, "bindable", lambda port: True)
    ports = private_cluster().ports
    assert ports == [22100, 12000, 13000, 14000, 15000, 16000]


def test_a_node_whose_port_another_server_took_did_not_start(
    private_cluster: Callable[[], PrivateCluster],
) -> None:
    # Free when chosen, taken before the node listened: the listener answering
    # there is not the node's server.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(NodeDidNotStart):
            private_cluster().start_node(port)
