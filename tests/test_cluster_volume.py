"""Overlap proof at volume on a real Redis Cluster: keys on every master, 0 overlaps."""

from __future__ import annotations

import math
import multiprocessing
from typing import Any

import pytest

from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis.slots import SLOTS, key_slot
from tests.cluster import PrivateCluster
from tests.volume_workers import overlaps, race_cluster

pytestmark = pytest.mark.slow

PROCESSES = 6


def spread_keys(prefix: str, count: int) -> list[str]:
    """``count`` keys whose slots fall in ``count`` equal ranges of the 16,384: every master."""
    found: dict[int, str] = {}
    width = SLOTS // count
    i = 0
    while len(found) < count:
        key = f"{prefix}:{i}"
        found.setdefault(key_slot(storage_key(key)) // width, key)
        i += 1
    return [found[band] for band in sorted(found) if band < count]


def test_ten_thousand_contended_acquisitions_over_every_slot_range_never_overlap(
    redis_cluster: PrivateCluster, key: str
) -> None:
    keys = spread_keys(key, 32)
    client = redis_cluster.client()
    masters = {client.get_node_from_key(storage_key(k)).name for k in keys}
    client.close()
    assert len(masters) == 3
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    attempts = math.ceil(10_000 / PROCESSES)
    procs = [
        ctx.Process(
            target=race_cluster, args=(redis_cluster.url, keys, attempts, barrier, results)
        )
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    assert [error for report in reports for error in report["errors"]] == []
    held = sum(len(v) for report in reports for v in report["held"].values())
    refused = sum(report["refused"] for report in reports)
    assert held + refused >= 10_000
    assert refused > 0, "there was no contention"
    for name in keys:
        intervals = [tuple(i) for report in reports for i in report["held"].get(name, [])]
        assert intervals, f"{name} was never held"
        assert overlaps(intervals) == [], name
