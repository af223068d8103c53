"""The heartbeat under load: statements per tick, its thread's CPU, lost leases; release latency.

Many leases are set up in bulk (one multi-row INSERT, not what is measured) and
handed to the process's heartbeat as ``run_exclusive`` would. Statements are
counted at the heartbeat's connection (Django's ``execute_wrapper`` around each
``refresh_many`` call: one call per backend per tick); the thread's CPU time
is read from ``/proc`` (Linux).
"""

from __future__ import annotations

import os
import secrets
import statistics
import threading
import time
from typing import Any

from django.db import OperationalError
from servers import RUN, log
from timing import percentile

from django_tasklock.backends.database import DatabaseBackend


class CountingBackend(DatabaseBackend):
    """The database backend, recording per ``refresh_many`` call: leases, statements, seconds."""

    def __init__(self, using: str) -> None:
        super().__init__(using=using)
        self.ticks: list[tuple[int, int, float]] = []
        #: The statements of the last call, with their parameters, as sent.
        self.last: list[tuple[str, Any]] = []

    def refresh_many(self, items: Any) -> list[bool]:
        from django.db import connections

        sent: list[tuple[str, Any]] = []

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            sent.append((sql, params))
            return execute(sql, params, many, context)

        started = time.perf_counter()
        with connections[self.using].execute_wrapper(count):
            answers = super().refresh_many(items)
        self.ticks.append((len(items), len(sent), time.perf_counter() - started))
        self.last = sent
        return answers


def _lease_class() -> Any:
    try:
        from django_tasklock.leases.heartbeat import Lease
    except ImportError:  # pragma: no cover - the class may live in a module of its own
        from django_tasklock.leases.lease import Lease  # type: ignore[no-redef]
    return Lease


def hold_many(backend: DatabaseBackend, count: int, ttl: float, interval: float) -> list[Any]:
    """``count`` leases held by this process and kept alive by its heartbeat."""
    from django.db.models.functions import Now

    from django_tasklock.backends.base import Holder, storage_key
    from django_tasklock.leases.heartbeat import heartbeat
    from django_tasklock.locking.options import LockOptions
    from django_tasklock.models import CacheEntry

    options = LockOptions.resolve(ttl=ttl, refresh_interval=interval)
    host = f"bench:{os.getpid()}:"
    tokens = {
        f"{RUN}held-{secrets.token_hex(4)}-{n}": host + secrets.token_urlsafe(18)
        for n in range(count)
    }
    rows = [
        CacheEntry(key=storage_key(k), value=t, expires_at=Now() + options.ttl, created_at=Now())
        for k, t in tokens.items()
    ]
    try:  # the heartbeat's own clock (one that counts suspend, where there is one)
        from django_tasklock.leases.heartbeat import clock
    except ImportError:  # pragma: no cover - older versions
        clock = time.monotonic
    asked_at = clock()
    CacheEntry.objects.using(backend.using).bulk_create(rows, batch_size=1000)
    lease_class = _lease_class()
    leases = [
        lease_class(backend, k, t, Holder.from_token(t), options, asked_at=asked_at)
        for k, t in tokens.items()
    ]
    for lease in leases:
        heartbeat().add(lease)
    return leases


def let_go(backend: DatabaseBackend, leases: list[Any]) -> None:
    from django_tasklock.leases.heartbeat import heartbeat

    for lease in leases:
        heartbeat().remove(lease)
    _delete_rows(backend)


def _delete_rows(backend: DatabaseBackend) -> None:
    from django_tasklock.models import CacheEntry

    rows = CacheEntry.objects.using(backend.using).filter(key__startswith=f"task-lock:{RUN}held-")
    # A tick already under way still sends its remaining chunks; on PostgreSQL
    # one bulk DELETE against those UPDATEs can deadlock: try again after it.
    for attempt in range(5):
        try:
            rows._raw_delete(backend.using)
            return
        except OperationalError:
            if attempt == 4:
                raise
            time.sleep(1)


def _thread_cpu_seconds(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _raw_floor(
    alias: str, statements: list[tuple[str, Any]], *, window: float, interval: float
) -> float:
    """Percent of a core a thread of the raw driver uses to send ``statements`` (and
    read their answers) every ``interval`` s for ``window`` s, on a connection of its own.

    The heartbeat's floor: the same statements with the same parameters, and
    nothing else (no leases to pick, no answers to judge).
    """
    from django.db import connections

    wrapper: Any = connections[alias]
    conn = wrapper.Database.connect(**wrapper.get_connection_params())
    conn.autocommit = True
    psycopg3 = hasattr(conn, "pgconn")
    if psycopg3:  # as Django's refresh sends them: bound on the client
        import psycopg

        cursor = psycopg.ClientCursor(conn)
    else:
        cursor = conn.cursor()
    share: list[float] = []

    def send() -> None:
        native = threading.get_native_id()
        cpu, start = _thread_cpu_seconds(native), time.monotonic()
        next_at = start
        while time.monotonic() - start < window:
            for sql, params in statements:
                cursor.execute(sql, params)
                if psycopg3:
                    while cursor.nextset():
                        pass
                if cursor.description is not None:
                    cursor.fetchall()
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        share.append(100 * (_thread_cpu_seconds(native) - cpu) / (time.monotonic() - start))

    try:
        thread = threading.Thread(target=send, name="bench-raw-heartbeat")
        thread.start()
        thread.join()
    finally:
        cursor.close()
        conn.close()
    return round(share[0], 1)


def heartbeat_load(
    alias: str, count: int, *, window: float, interval: float = 1.0
) -> dict[str, Any]:
    """Hold ``count`` leases (ttl 30 s) for ``window`` seconds; what the heartbeat did.

    Then, the leases out of the heartbeat but their rows kept, its floor: the
    statements of its last tick sent by the raw driver at the same interval.
    """
    from django_tasklock.leases.heartbeat import heartbeat

    backend = CountingBackend(alias)
    leases = hold_many(backend, count, ttl=30, interval=interval)
    try:
        thread = heartbeat()._thread
        if thread is None or thread.native_id is None:
            raise RuntimeError("the heartbeat thread did not start")
        time.sleep(interval * 1.2)  # the first tick (it also sets the statement timeout)
        first = list(backend.ticks)
        cpu, start = _thread_cpu_seconds(thread.native_id), time.monotonic()
        time.sleep(window)
        cpu = _thread_cpu_seconds(thread.native_id) - cpu
        elapsed = time.monotonic() - start
        steady = backend.ticks[len(first) :]
        lost = sum(lease.lost for lease in leases)
        for lease in leases:
            heartbeat().remove(lease)
        floor = _raw_floor(alias, backend.last, window=window, interval=interval)
    finally:
        let_go(backend, leases)
    statements = [sent for _, sent, _ in steady] or [0]
    out = {
        "locks": count,
        "refresh_interval_s": interval,
        "ticks": len(steady),
        "statements_per_tick": max(statements),
        "first_tick_statements": sum(sent for _, sent, _ in first),
        "leases_per_tick": max((n for n, _, _ in steady), default=0),
        "tick_ms_median": round(1000 * statistics.median(s for *_, s in steady), 1)
        if steady
        else None,
        "thread_cpu_percent": round(100 * cpu / elapsed, 1),
        "raw_floor_cpu_percent": floor,
        "lost": lost,
    }
    log(f"  heartbeat {count} leases: {out}")
    return out


def release_latency(alias: str, interval: float, cycles: int, background: int) -> dict[str, float]:
    """Release p99 of ``run_exclusive`` while ``background`` leases at ``interval`` keep the
    heartbeat busy; beside it, the same token DELETE sent raw (one round trip)."""
    from django.db import connections

    from django_tasklock.api.service import TaskLockService

    backend = DatabaseBackend(using=alias)
    service = TaskLockService(backend)
    held = hold_many(backend, background, ttl=3 * interval, interval=interval)
    ended: list[float] = []

    def work() -> None:
        ended.append(time.perf_counter())

    ours: list[float] = []
    raw: list[float] = []
    cursor = connections[alias].cursor()
    try:
        for n in range(cycles):
            service.run_exclusive(
                f"{RUN}release", work, ttl=3 * interval, refresh_interval=interval
            )
            ours.append(time.perf_counter() - ended[-1])
            key = f"{RUN}raw-release-{n}"
            cursor.execute(
                "INSERT INTO cache_entries (key, value, expires_at, created_at) "
                "VALUES (%s, 'x', CURRENT_TIMESTAMP + INTERVAL '1 minute', CURRENT_TIMESTAMP)"
                if connections[alias].vendor == "postgresql"
                else "INSERT INTO cache_entries (key, value, expires_at, created_at) "
                "VALUES (%s, 'x', '2999-01-01', '2000-01-01')",
                [key],
            )
            started = time.perf_counter()
            cursor.execute("DELETE FROM cache_entries WHERE key = %s AND value = 'x'", [key])
            raw.append(time.perf_counter() - started)
    finally:
        cursor.close()
        let_go(backend, held)
    out = {
        "p50_ms": round(1000 * statistics.median(ours), 2),
        "p99_ms": round(1000 * percentile(ours, 0.99), 2),
        "round_trip_p50_ms": round(1000 * statistics.median(raw), 2),
        "round_trip_p99_ms": round(1000 * percentile(raw, 0.99), 2),
    }
    log(f"  release at refresh_interval {interval} s: {out}")
    return out
