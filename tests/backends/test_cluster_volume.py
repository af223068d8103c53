"""Overlap proof at volume on a real Redis Cluster: keys over every slot range, 0 overlaps.

512 keys, one in each range of 32 of the 16,384 slots (so on every master,
and in every part of each master's slots), taken in turn by 6 processes in
step: each key's turn starts in all of them at once (a barrier), and each
makes 4 acquisitions of it, so that the processes fight over every key.
"""

from __future__ import annotations

import math
import multiprocessing
from typing import Any

import pytest

from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis.slots import SLOTS, key_slot
from tests.support.cluster import PrivateCluster
from tests.support.volume_workers import overlaps, race_cluster

pytestmark = pytest.mark.slow

PROCESSES = 6
KEYS = 512
ACQUISITIONS = 10_000


def spread_keys(prefix: str, count: int) -> list[str]:
    """``count`` keys whose slots fall in ``count`` equal ranges of the 16,384, one in each."""
    found: dict[int, str] = {}
    width = SLOTS // count
    i = 0
    while len(found) < count:
        key = f"{prefix}:{i}"
        band = key_slot(storage_key(key)) // width
        if band < count:
            found.setdefault(band, key)
        i += 1
    return [found[band] for band in sorted(found)]


def test_ten_thousand_contended_acquisitions_over_every_slot_range_never_overlap(
    redis_cluster: PrivateCluster, key: str
) -> None:
    keys = spread_keys(key, KEYS)
    width = SLOTS // KEYS
    assert sorted(key_slot(storage_key(k)) // width for k in keys) == list(range(KEYS))
    client = redis_cluster.client()
    masters = {client.get_node_from_key(storage_key(k)).name for k in keys}
    client.close()
    assert len(masters) == 3
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    per_key = math.ceil(ACQUISITIONS / (PROCESSES * KEYS))
    procs = [
        ctx.Process(target=race_cluster, args=(redis_cluster.url, keys, per_key, barrier, results))
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    assert [error for report in reports for error in report["errors"]] == []
    held = sum(len(v) for report in reports for v in report["held"].values())
    refused = sum(n for report in reports for n in report["refused"].values())
    assert held + refused == PROCESSES * KEYS * per_key >= ACQUISITIONS
    fought_over = {
        name
        for name in keys
        if sum(name in report["held"] for report in reports) >= 2
        and any(name in report["refused"] for report in reports)
    }
    # Held by two processes at least, and refused to one: most keys, whatever the load.
    assert len(fought_over) >= KEYS // 2, f"{len(fought_over)} of {KEYS} keys fought over"
    for name in keys:
        intervals = [tuple(i) for report in reports for i in report["held"].get(name, [])]
        assert intervals, f"{name} was never held"
        assert overlaps(intervals) == [], name
