"""Benchmark of django-tasklock against raw baselines measured in the same run.

Speed is reported as RATIOS library / raw (1.0 = no overhead over the bare
statements a lock needs), never as absolute thresholds: the absolute numbers
depend on the machine, the ratios much less. See bench/README.md.

    python bench/run.py [--backends sqlite,postgres,redis] [--seconds N] [--json]

Everything the run writes is cleaned up: the SQLite file lives in a temporary
directory, PostgreSQL gets a database of its own (``tasklock_bench_<pid>``,
created and dropped here; if that is not allowed, the database of the URL is
used and only this run's ``task-lock:bench-<run>-*`` rows are deleted), and in
Redis only this run's ``task-lock:bench-<run>-*`` keys are deleted.
"""

from __future__ import annotations

import argparse
import builtins
import datetime as dt
import itertools
import json
import logging
import os
import platform
import secrets
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import metadata
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from django_tasklock.backends.base import BaseBackend, HeldLock

DESCRIPTION = "Benchmark django-tasklock against raw baselines of the same run."
ALL_BACKENDS = ("sqlite", "postgres", "redis")
POSTGRES_ENV = "TASKLOCK_BENCH_POSTGRES_URL"
REDIS_ENV = "TASKLOCK_BENCH_REDIS_URL"
DEFAULT_POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/14"

#: Every key this run writes starts with this (the library adds "task-lock:").
RUN_PREFIX = f"bench-{secrets.token_hex(3)}-"
STORED_PREFIX = "task-lock:" + RUN_PREFIX
#: Lease length of every benchmark lock: leftovers of a killed run expire soon.
TTL = timedelta(seconds=60)
MAX_LIFETIME = timedelta(hours=24)
HOST, PID = socket.gethostname(), os.getpid()

Op = Callable[[int], None]


class BenchError(RuntimeError):
    """An operation did not do what the scenario expects (the numbers would be wrong)."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def token() -> str:
    """A token shaped like the library's (``host:pid:secret``), for the baselines."""
    return f"{HOST}:{PID}:{secrets.token_urlsafe(18)}"


def noop() -> None:
    return None


# -- measuring -----------------------------------------------------------------


def ops_per_second(op: Op, seconds: float, counter: Iterator[int]) -> tuple[float, float]:
    """Run ``op`` back to back for ``seconds``.

    Returns ops/s (wall clock) and this process's CPU time per op in
    microseconds (every thread of it, the heartbeat's included): the part of
    an op spent in Python rather than waiting for the server.
    """
    done = 0
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        op(next(counter))
        done += 1
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - start), (time.process_time() - cpu) * 1e6 / done


@dataclass
class Scenario:
    """One scenario: ops/s samples of each variant, taken round by round."""

    backend: str
    name: str
    samples: dict[str, list[float]]  # ops/s
    cpu: dict[str, list[float]]  # process CPU microseconds per op

    def median(self, variant: str) -> float:
        return statistics.median(self.samples[variant])

    def ratios(self, variant: str) -> list[float]:
        """``variant`` / raw, per round (both measured back to back in that round)."""
        return [v / r for v, r in zip(self.samples[variant], self.samples["raw"], strict=True)]

    def summary(self) -> dict[str, Any]:
        raw = self.median("raw")
        out: dict[str, Any] = {
            "backend": self.backend,
            "scenario": self.name,
            "raw_ops_per_s": round(raw, 1),
            "raw_cpu_us_per_op": round(statistics.median(self.cpu["raw"]), 1),
            "variants": {},
        }
        for variant in self.samples:
            if variant == "raw":
                continue
            ops, ratios = self.median(variant), self.ratios(variant)
            out["variants"][variant] = {
                "ops_per_s": round(ops, 1),
                "ratio": round(statistics.median(ratios), 3),
                "ratio_min": round(min(ratios), 3),
                "ratio_max": round(max(ratios), 3),
                # The library's cost per operation on top of the raw statements.
                "extra_us_per_op": round(1e6 / ops - 1e6 / raw, 1),
                "cpu_us_per_op": round(statistics.median(self.cpu[variant]), 1),
            }
        out["samples"] = {k: [round(v, 1) for v in vs] for k, vs in self.samples.items()}
        return out


def measure(
    backend: str, name: str, variants: dict[str, Op], seconds: float, repeat: int
) -> Scenario:
    """Interleaved rounds: every variant once per round, in a rotating order.

    A warm-up sample of each is thrown away first. Interleaving keeps a drift
    of the machine (another process, a checkpoint) from favouring one variant.
    """
    counter = itertools.count()
    names = list(variants)
    for variant in names:
        ops_per_second(variants[variant], seconds / 2, counter)
    samples: dict[str, list[float]] = {variant: [] for variant in names}
    cpu: dict[str, list[float]] = {variant: [] for variant in names}
    for round_no in range(repeat):
        shift = round_no % len(names)
        for variant in names[shift:] + names[:shift]:
            rate, cpu_per_op = ops_per_second(variants[variant], seconds, counter)
            samples[variant].append(rate)
            cpu[variant].append(cpu_per_op)
    scenario = Scenario(backend, name, samples, cpu)
    parts = ", ".join(
        f"{v} {scenario.median(v):,.0f}/s"
        + ("" if v == "raw" else f" (x{statistics.median(scenario.ratios(v)):.2f})")
        for v in names
    )
    log(f"  {name}: {parts}")
    return scenario


# -- a backend that records when the heartbeat refreshes ------------------------


Event = tuple[str, str, float, float, bool]  # what, key, started, ended (monotonic), ok


def recording(inner: BaseBackend) -> tuple[BaseBackend, list[Event]]:
    """``inner`` wrapped so that every acquire, refresh and release is recorded.

    (A class made here because BaseBackend can only be imported once Django
    is set up.)
    """
    from django_tasklock.backends.base import BaseBackend

    events: list[Event] = []

    class Recording(BaseBackend):
        capabilities = inner.capabilities

        def acquire(
            self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta
        ) -> bool:
            started = time.monotonic()
            ok = inner.acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)
            events.append(("acquire", key, started, time.monotonic(), ok))
            return ok

        def refresh(
            self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta
        ) -> bool:
            started = time.monotonic()
            ok = inner.refresh(key, token, ttl=ttl, max_lifetime=max_lifetime)
            events.append(("refresh", key, started, time.monotonic(), ok))
            return ok

        def release(self, key: str, token: str) -> bool:
            started = time.monotonic()
            ok = inner.release(key, token)
            events.append(("release", key, started, time.monotonic(), ok))
            return ok

        def force_release(self, key: str) -> bool:
            return inner.force_release(key)

        def peek(self, key: str) -> HeldLock | None:
            return inner.peek(key)

        def list(self) -> builtins.list[HeldLock]:
            return inner.list()

        def clear_stale(self, *, dry_run: bool = False) -> int:
            return inner.clear_stale(dry_run=dry_run)

        def close(self) -> None:
            inner.close()

    return Recording(), events


@dataclass
class HeartbeatRun:
    leases: int
    interval: float
    window: float
    refreshes: int
    failed_refreshes: int
    lags: list[float] = field(default_factory=list)  # seconds late vs schedule
    periods: dict[str, list[float]] = field(default_factory=dict)  # per lease, s between refreshes
    durations: list[float] = field(default_factory=list)  # seconds per refresh call
    lag_max_all: float = 0.0  # latest refresh over the whole run, start burst included
    lost_at_refresh: int = 0  # a refresh found the lease gone, before its release began
    lost_at_release: int = 0  # the release found it expired (the rest of LockResult.lost)

    @property
    def ideal_rate(self) -> float:
        return self.leases / self.interval

    @property
    def rate(self) -> float:
        """Refreshes per second, from each lease's mean period in the window.

        (Counting refreshes in the window instead would be quantised: leases
        taken within a few ms of each other are all refreshed n or n+1 times.)
        """
        return sum(len(p) / sum(p) for p in self.periods.values() if p)

    @property
    def busy(self) -> float:
        """Share of the window the heartbeat thread spent inside refresh calls."""
        return sum(self.durations) / self.window


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def heartbeat_once(target: Target, leases: int, interval: float, window: float) -> HeartbeatRun:
    """Hold ``leases`` locks in threads; watch the one heartbeat thread refresh them.

    ``ttl`` is 3 x ``interval`` (the library's default proportion), so a lease
    not refreshed within 2 intervals of its schedule is lost. The leases are
    taken one after the other and released one after the other, so that what
    is measured is the heartbeat, not K writers queueing for SQLite's lock.
    """
    from django_tasklock import TaskLockService

    backend, events = recording(target.backend)
    service = TaskLockService(backend)
    ready = threading.Semaphore(0)
    stops = [threading.Event() for _ in range(leases)]
    results: list[Any] = []
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        def work() -> None:
            ready.release()
            stops[n].wait()

        try:
            results.append(
                service.run_exclusive(
                    f"{RUN_PREFIX}hb-{n}",
                    work,
                    ttl=3 * interval,
                    refresh_interval=interval,
                    max_lifetime=MAX_LIFETIME,
                )
            )
        except BaseException as exc:  # reported below, after every thread ended
            errors.append(exc)
            ready.release()
        finally:
            target.close_thread()

    threads = [
        threading.Thread(target=worker, args=(n,), name=f"bench-hb-{n}") for n in range(leases)
    ]
    try:
        for thread in threads:
            thread.start()
            if not ready.acquire(timeout=60) or errors:
                raise BenchError(f"a heartbeat lease was not acquired: {errors[:1]!r}")
        time.sleep(3 * interval)  # let the schedule settle
        window_start = time.monotonic()
        time.sleep(window)
        window_end = time.monotonic()
    finally:
        for stop, thread in zip(stops, threads, strict=True):
            stop.set()
            if thread.ident is not None:
                thread.join()
    if errors:
        raise BenchError(f"{len(errors)} heartbeat workers failed: {errors[0]!r}")
    if len(results) != leases or not all(r.acquired for r in results):
        raise BenchError("a heartbeat lease was not acquired")

    # The heartbeat schedules a lease's next refresh ``interval`` after the
    # start of its previous one (or after its acquisition): lag is how much
    # later than that the refresh started.
    released = {key: started for what, key, started, _, _ in events if what == "release"}
    last: dict[str, float] = {}
    lost_at_refresh: set[str] = set()
    run = HeartbeatRun(leases, interval, window_end - window_start, 0, 0)
    for what, key, started, ended, ok in sorted(events, key=lambda e: e[2]):
        if what == "acquire":
            last[key] = ended
        elif what == "refresh":
            period = started - last[key]
            lag = period - interval
            last[key] = started
            if started < window_end:  # the start burst and the window, not the shutdown
                run.lag_max_all = max(run.lag_max_all, lag)
            if not ok and ended < released.get(key, float("inf")):
                lost_at_refresh.add(key)
            if window_start <= started < window_end:
                run.refreshes += 1
                run.failed_refreshes += not ok
                run.durations.append(ended - started)
                run.lags.append(lag)
                run.periods.setdefault(key, []).append(period)
    run.lost_at_refresh = len(lost_at_refresh)
    run.lost_at_release = max(0, sum(r.lost for r in results) - run.lost_at_refresh)
    return run


def heartbeat_summary(
    backend: str, runs: list[HeartbeatRun], refresh_ops: float
) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    first = runs[0]
    lag_p50 = med([percentile(r.lags, 0.5) for r in runs])
    lag_p95 = med([percentile(r.lags, 0.95) for r in runs])
    lag_max = max(max(r.lags, default=0.0) for r in runs)
    duration = med([statistics.fmean(r.durations) for r in runs if r.durations] or [0.0])
    rate = med([r.rate for r in runs])
    lost = sum(r.lost_at_refresh for r in runs)
    keeps_up = rate >= 0.9 * first.ideal_rate and lag_max < first.interval and lost == 0
    return {
        "backend": backend,
        "leases": first.leases,
        "refresh_interval_s": first.interval,
        "ttl_s": 3 * first.interval,
        "window_s": round(med([r.window for r in runs]), 2),
        "ideal_refreshes_per_s": round(first.ideal_rate, 1),
        "refreshes_per_s": round(rate, 1),
        "refreshes_in_windows": sum(r.refreshes for r in runs),
        "achieved_over_ideal": round(rate / first.ideal_rate, 3),
        "lag_p50_ms": round(lag_p50 * 1000, 1),
        "lag_p95_ms": round(lag_p95 * 1000, 1),
        "lag_max_ms": round(lag_max * 1000, 1),
        "lag_max_with_start_ms": round(max(r.lag_max_all for r in runs) * 1000, 1),
        "refresh_call_ms": round(duration * 1000, 3),
        "thread_busy": round(med([r.busy for r in runs]), 3),
        # Leases one heartbeat thread could keep at this interval, from its
        # measured time per refresh (in the thread) and from the sequential
        # backend.refresh rate (scenario "refresh").
        "capacity_leases": round(first.interval / duration) if duration else None,
        "capacity_leases_sequential": round(first.interval * refresh_ops),
        "failed_refreshes": sum(r.failed_refreshes for r in runs),
        "lost_at_refresh": lost,
        # Not the heartbeat's doing: K releases at once queue (SQLite's write lock)
        # past the short ttl after the heartbeat has stopped refreshing them.
        "lost_at_release": sum(r.lost_at_release for r in runs),
        "keeps_up": keeps_up,
        "repetitions": len(runs),
    }


# -- the storages under test ------------------------------------------------------


class Target:
    """One storage: our backend on it, and the same operations without the library."""

    name: str
    backend: BaseBackend

    def raw_acquire(self, key: str, token: str) -> bool:
        raise NotImplementedError

    def raw_release(self, key: str, token: str) -> bool:
        raise NotImplementedError

    def raw_refresh(self, key: str, token: str) -> bool:
        raise NotImplementedError

    def raw_contended(self, key: str, token: str) -> bool:
        """Try to take a held key: True if it was refused, as expected."""
        raise NotImplementedError

    def leftovers(self) -> int:
        """Delete what this run left behind (should be nothing); return how much."""
        raise NotImplementedError

    def close_thread(self) -> None:
        """Let go of the calling thread's connections."""

    def server_version(self) -> str:
        raise NotImplementedError


class DatabaseTarget(Target):
    """cache_entries in a Django database; the baseline is a DB-API cursor of the
    very connection the library uses, in autocommit, with the statements the
    ORM sends (server-side time, token-bound DELETE/UPDATE)."""

    def __init__(self, name: str, alias: str) -> None:
        from django.db import connections

        from django_tasklock.backends.database import DatabaseBackend

        self.name, self.alias = name, alias
        self.backend = DatabaseBackend(using=alias)
        self.connection = connections[alias]
        self.connection.ensure_connection()
        assert self.connection.get_autocommit()
        self.cursor = self.connection.connection.cursor()
        ttl_s, cap_s = int(TTL.total_seconds()), int(MAX_LIFETIME.total_seconds())
        self.integrity_error: type[Exception]
        if self.connection.vendor == "postgresql":
            import psycopg

            self.integrity_error = psycopg.IntegrityError
            now = "statement_timestamp()"
            self.ttl_params: tuple[Any, ...] = (TTL,)
            self.refresh_params: tuple[Any, ...] = (TTL, MAX_LIFETIME)
            self.sql_insert = (
                'INSERT INTO cache_entries ("key", "value", expires_at, created_at) '
                f"VALUES (%s, %s, {now} + %s, {now})"
            )
            self.sql_refresh = (
                f"UPDATE cache_entries SET expires_at = LEAST({now} + %s, created_at + %s) "
                f'WHERE "key" = %s AND "value" = %s AND expires_at > {now}'
            )
            mark = "%s"
        elif self.connection.vendor == "sqlite":
            self.integrity_error = sqlite3.IntegrityError
            now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
            self.ttl_params = (f"+{ttl_s} seconds",)
            self.refresh_params = (f"+{ttl_s} seconds", f"+{cap_s} seconds")
            self.sql_insert = (
                'INSERT INTO cache_entries ("key", "value", expires_at, created_at) '
                f"VALUES (?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now', ?), {now})"
            )
            self.sql_refresh = (
                "UPDATE cache_entries SET expires_at = MIN("
                "strftime('%Y-%m-%d %H:%M:%f', 'now', ?), "
                "strftime('%Y-%m-%d %H:%M:%f', created_at, ?)) "
                f'WHERE "key" = ? AND "value" = ? AND expires_at > {now}'
            )
            mark = "?"
        else:  # pragma: no cover - only the two databases above are benchmarked
            raise BenchError(f"no raw statements for {self.connection.vendor}")
        self.sql_release = (
            f'DELETE FROM cache_entries WHERE "key" = {mark} AND "value" = {mark} '
            f"AND expires_at > {now}"
        )
        self.sql_exists = f'SELECT 1 FROM cache_entries WHERE "key" = {mark} LIMIT 1'
        self.sql_leftovers = f'DELETE FROM cache_entries WHERE "key" LIKE {mark}'

    def raw_acquire(self, key: str, token: str) -> bool:
        self.cursor.execute(self.sql_insert, ("task-lock:" + key, token, *self.ttl_params))
        return True

    def raw_release(self, key: str, token: str) -> bool:
        self.cursor.execute(self.sql_release, ("task-lock:" + key, token))
        return bool(self.cursor.rowcount == 1)

    def raw_refresh(self, key: str, token: str) -> bool:
        self.cursor.execute(self.sql_refresh, (*self.refresh_params, "task-lock:" + key, token))
        return bool(self.cursor.rowcount == 1)

    def raw_contended(self, key: str, token: str) -> bool:
        stored = "task-lock:" + key
        try:
            self.cursor.execute(self.sql_insert, (stored, token, *self.ttl_params))
        except self.integrity_error:
            self.cursor.execute(self.sql_exists, (stored,))
            return self.cursor.fetchone() is not None
        return False

    def leftovers(self) -> int:
        self.cursor.execute(self.sql_leftovers, (STORED_PREFIX + "%",))
        return int(self.cursor.rowcount)

    def close_thread(self) -> None:
        from django.db import connections

        connections.close_all()

    def server_version(self) -> str:
        if self.connection.vendor == "sqlite":
            return f"SQLite {sqlite3.sqlite_version}"
        self.cursor.execute("SHOW server_version")
        row = self.cursor.fetchone()
        return f"PostgreSQL {row[0].split()[0] if row else '?'}"


_RAW_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RAW_REFRESH_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class RedisTarget(Target):
    """Redis through the django-redis client; the baseline uses that same client:
    ``SET key token NX PX`` to acquire, the classic compare-and-delete
    (and compare-and-PEXPIRE) Lua scripts by EVALSHA to release (and refresh)."""

    def __init__(self, cache_alias: str) -> None:
        from django_redis import get_redis_connection

        from django_tasklock.backends.redis import RedisBackend

        self.name = "redis"
        self.client = get_redis_connection(cache_alias, write=True)
        self.client.ping()
        self.backend = RedisBackend(client=self.client)
        self.ttl_ms = int(TTL.total_seconds() * 1000)
        self.release_script = self.client.register_script(_RAW_RELEASE_LUA)
        self.refresh_script = self.client.register_script(_RAW_REFRESH_LUA)

    def raw_acquire(self, key: str, token: str) -> bool:
        return bool(self.client.set("task-lock:" + key, token, nx=True, px=self.ttl_ms))

    def raw_release(self, key: str, token: str) -> bool:
        return bool(self.release_script(keys=["task-lock:" + key], args=[token]))

    def raw_refresh(self, key: str, token: str) -> bool:
        return bool(self.refresh_script(keys=["task-lock:" + key], args=[token, self.ttl_ms]))

    def raw_contended(self, key: str, token: str) -> bool:
        return self.client.set("task-lock:" + key, token, nx=True, px=self.ttl_ms) is None

    def leftovers(self) -> int:
        keys = list(self.client.scan_iter(match=STORED_PREFIX + "*", count=500))
        return int(self.client.delete(*keys)) if keys else 0

    def server_version(self) -> str:
        return f"Redis {self.client.info('server')['redis_version']}"


# -- the scenarios ------------------------------------------------------------------


def check(ok: bool, what: str) -> None:
    if not ok:
        raise BenchError(what)


def bench_target(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    from django_tasklock import TaskLockService

    service = TaskLockService(target.backend)
    backend = target.backend
    name, seconds, repeat = target.name, args.seconds, args.repeat
    same = f"{RUN_PREFIX}same"

    def service_op(key_of: Callable[[int], str]) -> Op:
        def op(i: int) -> None:
            check(service.run_exclusive(key_of(i), noop, ttl=TTL).acquired, "not acquired")

        return op

    def backend_op(key_of: Callable[[int], str]) -> Op:
        def op(i: int) -> None:
            key, tok = key_of(i), token()
            check(backend.acquire(key, tok, ttl=TTL, max_lifetime=MAX_LIFETIME), "acquire")
            check(backend.release(key, tok), "release")

        return op

    def raw_op(key_of: Callable[[int], str]) -> Op:
        def op(i: int) -> None:
            key, tok = key_of(i), token()
            check(target.raw_acquire(key, tok), "raw acquire")
            check(target.raw_release(key, tok), "raw release")

        return op

    def same_key(suffix: str) -> Callable[[int], str]:
        return lambda i: same + suffix

    def unique_key(suffix: str) -> Callable[[int], str]:
        return lambda i: f"{RUN_PREFIX}u{suffix}-{i}"

    scenarios = [
        measure(
            name,
            "uncontended, same key",
            {
                "run_exclusive": service_op(same_key("-s")),
                "backend": backend_op(same_key("-p")),
                "raw": raw_op(same_key("-r")),
            },
            seconds,
            repeat,
        ),
        measure(
            name,
            "uncontended, unique keys",
            {
                "run_exclusive": service_op(unique_key("s")),
                "raw": raw_op(unique_key("r")),
            },
            seconds,
            repeat,
        ),
    ]

    # Held by "another worker" for the whole scenario, however long it is told to run.
    held, holder = f"{RUN_PREFIX}held", "elsewhere:1:" + secrets.token_urlsafe(18)
    held_ttl = TTL + timedelta(seconds=4 * seconds * (repeat + 1))
    check(backend.acquire(held, holder, ttl=held_ttl, max_lifetime=MAX_LIFETIME), "hold")
    try:

        def service_refused(i: int) -> None:
            check(not service.run_exclusive(held, noop, ttl=TTL).acquired, "was acquired")

        def backend_refused(i: int) -> None:
            refused = not backend.acquire(held, token(), ttl=TTL, max_lifetime=MAX_LIFETIME)
            check(refused, "was acquired")

        def raw_refused(i: int) -> None:
            check(target.raw_contended(held, token()), "raw was acquired")

        scenarios.append(
            measure(
                name,
                "contended (key held)",
                {
                    "run_exclusive": service_refused,
                    "backend": backend_refused,
                    "raw": raw_refused,
                },
                seconds,
                repeat,
            )
        )

        mine, raw_mine = f"{RUN_PREFIX}refresh-p", f"{RUN_PREFIX}refresh-r"
        check(backend.acquire(mine, holder, ttl=TTL, max_lifetime=MAX_LIFETIME), "hold")
        check(target.raw_acquire(raw_mine, holder), "raw hold")

        def backend_refresh(i: int) -> None:
            check(backend.refresh(mine, holder, ttl=TTL, max_lifetime=MAX_LIFETIME), "lost")

        def raw_refresh(i: int) -> None:
            check(target.raw_refresh(raw_mine, holder), "raw lost")

        scenarios.append(
            measure(
                name,
                "refresh (one lease, sequential)",
                {"backend": backend_refresh, "raw": raw_refresh},
                seconds,
                repeat,
            )
        )
        check(backend.release(mine, holder), "release refresh lease")
        check(target.raw_release(raw_mine, holder), "raw release refresh lease")
    finally:
        backend.release(held, holder)

    runs = []
    for _ in range(args.heartbeat_repeat):
        runs.append(
            heartbeat_once(
                target, args.heartbeat_leases, args.heartbeat_interval, args.heartbeat_window
            )
        )
    refresh_ops = scenarios[-1].median("backend")
    heartbeat = heartbeat_summary(name, runs, refresh_ops)
    log(
        f"  heartbeat: {heartbeat['refreshes_per_s']}/s of {heartbeat['ideal_refreshes_per_s']}"
        f"/s, lag p95 {heartbeat['lag_p95_ms']} ms, max {heartbeat['lag_max_ms']} ms, "
        f"busy {heartbeat['thread_busy']:.0%}, keeps up: {heartbeat['keeps_up']}"
    )
    return {
        "server": target.server_version(),
        "scenarios": [s.summary() for s in scenarios],
        "heartbeat": heartbeat,
    }


# -- set-up and tear-down ------------------------------------------------------------


def postgres_settings(url: str, name: str | None = None) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name or parts.path.lstrip("/") or "postgres",
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 5432),
    }


@contextmanager
def postgres_database(url: str) -> Iterator[tuple[dict[str, Any], str]]:
    """A database of our own, dropped afterwards; else the URL's (see the module doc)."""
    import psycopg
    from psycopg import sql

    name = f"tasklock_bench_{os.getpid()}"
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as admin:
        try:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege as exc:
            log(f"postgres: cannot create a database ({exc}); using the URL's own")
            created = False
        else:
            created = True
        if not created:
            yield postgres_settings(url), "the URL's database (only this run's rows deleted)"
            return
        try:
            yield postgres_settings(url, name), f"dedicated database {name} (dropped after)"
        finally:
            force = " WITH (FORCE)" if admin.info.server_version >= 130000 else ""
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {}" + force).format(sql.Identifier(name))
            )


def configure_django(databases: dict[str, Any], redis_url: str | None) -> None:
    import django
    from django.conf import settings

    caches: dict[str, Any] = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    }
    if redis_url:
        caches["redis"] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}
    settings.configure(
        SECRET_KEY="django-tasklock-bench",
        USE_TZ=True,
        INSTALLED_APPS=["django_tasklock"],
        DATABASES=databases,
        CACHES=caches,
        TASKLOCK_BACKEND="database",
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    django.setup()


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in ("django", "django-tasklock", "psycopg", "redis", "django-redis"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "-"
    found["django-tasklock"] += library_revision()
    return found


def library_revision() -> str:
    """`` (git <commit>[, modified])`` of the imported package's checkout, if it is one."""
    import django_tasklock

    where = os.path.dirname(os.path.abspath(django_tasklock.__file__))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "."], cwd=where, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return ""
    if not commit:
        return ""
    return f" (git {commit}{', modified' if changed else ''})"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument(
        "--backends",
        default=",".join(ALL_BACKENDS),
        help="comma-separated subset of sqlite,postgres,redis (default: all)",
    )
    parser.add_argument(
        "--seconds", type=float, default=0.3, help="length of one timed sample (default 0.3)"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed samples per variant (default 5)"
    )
    parser.add_argument(
        "--heartbeat-leases", type=int, default=50, help="leases held at once (default 50)"
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=0.2,
        help="refresh_interval in seconds; ttl is 3 times it (default 0.2)",
    )
    parser.add_argument(
        "--heartbeat-window", type=float, default=2.0, help="seconds observed (default 2)"
    )
    parser.add_argument(
        "--heartbeat-repeat", type=int, default=3, help="heartbeat repetitions (default 3)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backends) - set(ALL_BACKENDS)
    if unknown or not args.backends:
        parser.error(f"--backends: choose from {', '.join(ALL_BACKENDS)}")
    if min(args.seconds, args.heartbeat_interval, args.heartbeat_window) <= 0:
        parser.error("--seconds and the heartbeat interval and window must be > 0")
    if min(args.repeat, args.heartbeat_repeat, args.heartbeat_leases) < 1:
        parser.error("--repeat, --heartbeat-repeat and --heartbeat-leases must be >= 1")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": versions(),
        "settings": {
            k: getattr(args, k)
            for k in (
                "seconds",
                "repeat",
                "heartbeat_leases",
                "heartbeat_interval",
                "heartbeat_window",
                "heartbeat_repeat",
            )
        },
        "key_prefix": "task-lock:" + RUN_PREFIX,
        "backends": {},
        "skipped": {},
    }
    tmp = tempfile.mkdtemp(prefix="tasklock-bench-")
    try:
        databases: dict[str, Any] = {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": os.path.join(tmp, "bench.sqlite3"),
            }
        }
        pg_url = os.environ.get(POSTGRES_ENV) or DEFAULT_POSTGRES_URL
        redis_url = os.environ.get(REDIS_ENV) or DEFAULT_REDIS_URL
        with ExitStack() as stack:
            if "postgres" in args.backends:
                try:
                    pg, how = stack.enter_context(postgres_database(pg_url))
                except Exception as exc:  # no server, or it refused us
                    log(f"postgres: skipped: {type(exc).__name__}: {exc}")
                    report["skipped"]["postgres"] = f"{type(exc).__name__}: {exc}"
                else:
                    databases["postgres"] = pg
                    report["postgres_database"] = how
            configure_django(databases, redis_url if "redis" in args.backends else None)
            from django.core.management import call_command
            from django.db import connections

            for backend in args.backends:
                if backend in report["skipped"]:
                    continue
                log(f"{backend}:")
                alias = "default" if backend == "sqlite" else backend
                target: Target
                try:
                    if backend == "redis":
                        target = RedisTarget(alias)
                    else:
                        call_command("migrate", database=alias, verbosity=0)
                        target = DatabaseTarget(backend, alias)
                except Exception as exc:  # the service is not there
                    log(f"  skipped: {type(exc).__name__}: {exc}")
                    report["skipped"][backend] = f"{type(exc).__name__}: {exc}"
                    continue
                try:
                    report["backends"][backend] = bench_target(target, args)
                finally:
                    left = target.leftovers()
                    if left:
                        log(f"  {left} leftover bench keys/rows deleted")
                if backend in report["backends"]:
                    report["backends"][backend]["leftover_keys_deleted"] = left
            # Let the heartbeat thread go idle (it then closes its connections).
            time.sleep(0.3)
            connections.close_all()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    return report


# -- output ------------------------------------------------------------------------


def print_tables(report: dict[str, Any]) -> None:
    v = report["versions"]
    servers = ", ".join(b["server"] for b in report["backends"].values())
    s = report["settings"]
    print(
        f"django-tasklock {v['django-tasklock']} benchmark, {report['date']}\n"
        f"Python {v['python']}, Django {v['django']}, psycopg {v['psycopg']}, "
        f"redis-py {v['redis']}, django-redis {v['django-redis']}; {servers}; "
        f"{report['machine']['cpus']} CPUs\n"
        f"median of {s['repeat']} interleaved samples of {s['seconds']} s; "
        "ratio = variant ops/s / raw ops/s of the same round (1.00 = no overhead)\n"
    )
    header = (
        f"{'backend':<9}{'scenario':<32}{'variant':<14}{'ops/s':>8}{'raw ops/s':>10}"
        f"{'ratio':>7}{'min-max':>11}{'+us/op':>8}{'cpu us/op':>11}"
    )
    print(header)
    print("-" * len(header))
    for backend, result in report["backends"].items():
        for scenario in result["scenarios"]:
            for variant, m in scenario["variants"].items():
                spread = f"{m['ratio_min']:.2f}-{m['ratio_max']:.2f}"
                cpu = f"{m['cpu_us_per_op']:.0f}/{scenario['raw_cpu_us_per_op']:.0f}"
                print(
                    f"{backend:<9}{scenario['scenario']:<32}{variant:<14}"
                    f"{m['ops_per_s']:>8,.0f}{scenario['raw_ops_per_s']:>10,.0f}"
                    f"{m['ratio']:>7.2f}{spread:>11}{m['extra_us_per_op']:>8.0f}{cpu:>11}"
                )
    print("(+us/op: wall time the variant adds per op; cpu us/op: variant/raw process CPU)")
    print()
    print(
        f"heartbeat: {s['heartbeat_leases']} leases held at once, refresh every "
        f"{s['heartbeat_interval']} s, ttl 3x that; {s['heartbeat_window']} s windows x "
        f"{s['heartbeat_repeat']}; lag in ms vs schedule"
    )
    header = (
        f"{'backend':<9}{'ideal/s':>8}{'got/s':>7}{'got/ideal':>10}{'lag p50':>8}{'p95':>6}"
        f"{'max':>6}{'max+start':>10}{'ms/refresh':>11}{'busy':>6}{'capacity':>9}"
        f"{'lost':>5}{'lost@rel':>9}  keeps up"
    )
    print(header)
    print("-" * len(header))
    for backend, result in report["backends"].items():
        h = result["heartbeat"]
        print(
            f"{backend:<9}{h['ideal_refreshes_per_s']:>8.0f}{h['refreshes_per_s']:>7.0f}"
            f"{h['achieved_over_ideal']:>10.2f}{h['lag_p50_ms']:>8.1f}{h['lag_p95_ms']:>6.1f}"
            f"{h['lag_max_ms']:>6.1f}{h['lag_max_with_start_ms']:>10.1f}"
            f"{h['refresh_call_ms']:>11.2f}{h['thread_busy']:>6.0%}"
            f"{h['capacity_leases']!s:>9}{h['lost_at_refresh']:>5}{h['lost_at_release']:>9}"
            f"  {'yes' if h['keeps_up'] else 'NO'}"
        )
    print(
        "(capacity: leases one heartbeat thread could refresh at this interval; "
        "lost: at a refresh; lost@rel: expired before its release)"
    )
    print()
    if "postgres_database" in report:
        print(f"postgres: {report['postgres_database']}")
    for backend, reason in report["skipped"].items():
        print(f"{backend}: SKIPPED ({reason})")
    print(f"elapsed {report['elapsed_s']} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Clean up (drop the database, delete the keys) on kill as on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_tables(report)
    return 1 if report["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main())
