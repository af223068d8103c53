"""What the ``unique_on=`` tests with real workers do: bursts of enqueues, killed workers.

A burst of identical enqueues: several processes, many threads each, at once.
Each process (spawned, with the environment of the test's workers: the same
lock storage, broker and queue) starts its threads, which open their
connection to the lock storage and wait; once every process is ready, all
the threads enqueue the same task at the same moment. Each process reports
how many enqueues were accepted, the lease each refusal named (None for none)
and any other error.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.synchronize import Barrier
from pathlib import Path
from queue import Queue
from typing import Any

from django_tasklock.backends import get_backend
from django_tasklock.backends.base import HeldLock

PATIENCE = 120.0
#: A refresh the killed worker sent before it died, applied by the storage a moment later.
IN_FLIGHT = 0.5
#: How long this process may take to see a dead worker's key go (not the promise: ttl is).
NOTICE = 30.0


def burst(
    env: dict[str, str],
    framework: str,
    name: str,
    signals: str,
    threads: int,
    everyone: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """In a spawned process: ``threads`` enqueues of ``hold_unique(name, signals)`` at once."""
    report: dict[str, Any] = {"pid": os.getpid(), "sent": [], "refused": [], "errors": []}
    try:
        os.environ.update(env)
        import django

        django.setup()
        from django.db import connections

        from django_tasklock.backends import get_backend
        from django_tasklock.exceptions import AlreadyEnqueued

        if framework == "celery":
            from tests.jobs import celery_unique

            def send() -> Any:
                return celery_unique.hold_unique.delay(name, signals)
        else:
            from tests.jobs import django_unique

            queued = django_unique.hold_unique.using(backend="database")

            def send() -> Any:
                return queued.enqueue(name, signals)

        go = threading.Barrier(threads + 1)

        def enqueue() -> None:
            try:
                get_backend().peek(f"unique:{name}")  # this thread's connection, opened now
                go.wait(timeout=PATIENCE)
                try:
                    report["sent"].append(str(send().id))
                except AlreadyEnqueued as exc:
                    report["refused"].append(exc.held.lease if exc.held else None)
            except BaseException:
                report["errors"].append(traceback.format_exc())
            finally:
                connections.close_all()

        started = [threading.Thread(target=enqueue) for _ in range(threads)]
        for thread in started:
            thread.start()
        everyone.wait(timeout=PATIENCE)  # every process's threads are ready
        go.wait(timeout=PATIENCE)
        for thread in started:
            thread.join(timeout=PATIENCE)
    except BaseException:
        report["errors"].append(traceback.format_exc())
    results.put(report)


def enqueue_at_once(
    env: dict[str, str], framework: str, name: str, signals: str, processes: int, threads: int
) -> list[dict[str, Any]]:
    """The reports of ``processes`` processes of ``threads`` threads enqueueing at once."""
    ctx = multiprocessing.get_context("spawn")
    everyone, results = ctx.Barrier(processes), ctx.Queue()
    args = (env, framework, name, signals, threads, everyone, results)
    started = [ctx.Process(target=burst, args=args) for _ in range(processes)]
    for process in started:
        process.start()
    try:
        return [results.get(timeout=PATIENCE) for _ in started]
    finally:
        for process in started:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()


def assert_freed_within_ttl(key: str, ttl: float, kill: Callable[[], object]) -> None:
    """``kill()`` the task's worker: its key is free ``ttl`` after that, by the storage's clock.

    The first look after the kill reads the storage's clock (the lease's
    expiry less its time left); from then on the lease's expiry may never be
    later than that plus ``ttl``: nobody refreshes it. ``IN_FLIGHT`` is for a
    refresh the worker sent just before it died, which the storage may apply
    just after that look. How long this process then takes to see the key go
    (polling, on a loaded machine) is not part of the promise: ``NOTICE``.
    """
    backend = get_backend()
    kill()
    first = backend.peek(key)
    assert first is not None, "the kill freed the key: nobody should have"
    after_kill = first.expires_at - timedelta(seconds=first.seconds_left)
    latest = after_kill + timedelta(seconds=ttl + IN_FLIGHT)
    deadline = time.monotonic() + NOTICE
    held: HeldLock | None = first
    while held is not None:
        assert held.lease == first.lease
        assert held.expires_at <= latest, f"refreshed after the kill (by {after_kill}): {held}"
        assert time.monotonic() < deadline, f"{key} still held: {held}"
        time.sleep(0.05)
        held = backend.peek(key)


def parent_of(pid: int) -> int | None:
    """The parent of a live process; None once it is gone (or a zombie, dead already)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    state, parent = stat.rpartition(")")[2].split()[:2]  # after the command's name
    return None if state in {"Z", "X"} else int(parent)
