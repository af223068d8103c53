"""Overlap proof at volume: many processes, thousands of contended acquisitions, 0 overlaps."""

from __future__ import annotations

import math
import multiprocessing
from typing import Any

import pytest

from django_tasklock.testing import ContractBackend
from tests.support.volume_workers import overlaps, race

pytestmark = pytest.mark.slow


def _race(
    contract_backend: ContractBackend, key: str, processes: int, attempts: int, durable: bool
) -> Any:
    if not contract_backend.backend.capabilities.cross_process:
        pytest.skip(f"{contract_backend.name}: one process only")
    recipe = contract_backend.recipe
    assert recipe is not None
    kind = contract_backend.name.rpartition(":")[2]  # "database:postgresql" -> "postgresql"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(target=race, args=(recipe, kind, key, attempts, barrier, results, durable))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    reports = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    return reports


def test_overlap_checker_finds_an_overlap() -> None:
    assert overlaps([(0.0, 1.0), (2.0, 3.0)]) == []
    assert overlaps([(0.0, 10.0), (2.0, 3.0), (4.0, 5.0)]) == [
        ((0.0, 10.0), (2.0, 3.0)),
        ((0.0, 10.0), (4.0, 5.0)),
    ]


def test_ten_thousand_contended_acquisitions_never_overlap(
    any_backend: ContractBackend, key: str
) -> None:
    processes = 6
    reports = _race(any_backend, key, processes, math.ceil(10_000 / processes), durable=False)
    assert [error for report in reports for error in report["errors"]] == []
    intervals = [tuple(i) for report in reports for i in report["held"]]
    refused = sum(report["refused"] for report in reports)
    assert len(intervals) + refused >= 10_000
    assert refused > 0, "there was no contention"
    assert len({report["pid"] for report in reports if report["held"]}) >= 2
    assert overlaps(intervals) == []


@pytest.mark.databases
def test_sqlite_under_eight_writers_never_says_locked_or_overlaps(key: str) -> None:
    from tests.conftest import database_backend

    reports = _race(database_backend("default"), key, 8, 200, durable=True)
    assert [error for report in reports for error in report["errors"]] == []
    intervals = [tuple(i) for report in reports for i in report["held"]]
    assert len(intervals) + sum(report["refused"] for report in reports) == 1600
    assert overlaps(intervals) == []
