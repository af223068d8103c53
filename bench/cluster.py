"""The Redis heartbeat at 10,000 leases: on a Redis Cluster, and on one Redis for scale.

    python bench/cluster.py [--leases 10000] [--window 10] [--publish [--loaded]]

Starts its own servers on free loopback ports (``tests/support/cluster.py``: 3
masters + 3 replicas; ``tests/support/servers.py``: one ``redis-server``), so it needs
the ``test`` extra and the Debian ``redis-server``; nothing shared is touched.
The leases (ttl 30 s, refresh interval 1 s) are acquired one at a time before
the window (not measured) and handed to the process's heartbeat as
``run_exclusive`` would. Over the window: scripts per tick (``EVALSHA`` calls
counted by the masters' ``INFO commandstats``, divided by the heartbeat's
``refresh_many`` calls), the heartbeat thread's CPU (from ``/proc``), the
median tick, lost leases, the reaps of dead holders in the window (their
scripts and time, on the same thread); on one Redis, beside it, the raw floor: a thread of
redis-py sending the heartbeat's last tick as it was sent (the same packed
``EVALSHA`` calls) every second on one connection, and reading the replies.
The heartbeat's thread also reaps dead holders (every 5 s at least: a ``SCAN``
and a script per 500 keys found, or per slot on the cluster, the process's own
leases left out), which the floor does not. On the cluster,
refreshes go one script per hash slot and 500 leases: at 10,000 leases spread
over the 16,384 slots, some 7,300 small scripts a tick, one pipeline per
master. One Redis takes any 500 leases in one script: 20 a tick. It is
measured that way, and again per slot (``single_per_slot``: as behind a proxy
that hides a cluster, which refuses keys of two slots in one script).

``--publish`` puts the run in docs/speed.md (its "Redis Cluster" table, between
``<!-- cluster:begin -->`` and ``<!-- cluster:end -->``), refusing a run that
began with a load average above 0.3 per core (as ``bench/publish.py``) unless
``--loaded``, which says so under the table.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import django
from django.conf import settings

SPEED = Path(__file__).resolve().parent.parent / "docs" / "speed.md"
BEGIN, END = "<!-- cluster:begin -->", "<!-- cluster:end -->"
IDLE_PER_CORE = 0.3  # as bench/publish.py
ROWS = {
    "cluster": "Redis Cluster, 3 masters + 3 replicas",
    "single_per_slot": "one Redis, per slot (as behind a cluster proxy)",
    "single": "one Redis (one script per 500 leases)",
}


class CountingRedis:
    """Wraps ``RedisBackend.refresh_many``: (leases, seconds) per call."""

    def __init__(self, backend: Any) -> None:
        self.ticks: list[tuple[int, float]] = []
        original = backend.refresh_many

        def refresh_many(items: Any) -> list[bool]:
            started = time.perf_counter()
            answers: list[bool] = original(items)
            self.ticks.append((len(items), time.perf_counter() - started))
            return answers

        backend.refresh_many = refresh_many
        #: Per reap of dead holders (also on the heartbeat's thread): its scripts, seconds.
        self.reaps: list[tuple[int, float]] = []
        self.nodes: list[Any] = []
        reap = backend.reap_dead_holders

        def reap_dead_holders(alive: Any = ()) -> Any:
            calls, started = _evalsha_calls(self.nodes), time.perf_counter()
            ended = reap(alive)
            took = time.perf_counter() - started
            self.reaps.append((_evalsha_calls(self.nodes) - calls, took))
            return ended

        backend.reap_dead_holders = reap_dead_holders


def _thread_cpu_seconds(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _evalsha_calls(nodes: list[Any]) -> int:
    return sum(
        int(node.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)) for node in nodes
    )


def measure(
    url: str, nodes: list[Any], leases: int, window: float, per_slot: bool = False
) -> dict[str, Any]:
    from django_tasklock.backends.base import Holder
    from django_tasklock.backends.redis import RedisBackend
    from django_tasklock.leases.heartbeat import heartbeat
    from django_tasklock.leases.lease import Lease, clock
    from django_tasklock.locking.options import LockOptions

    backend = RedisBackend(url=url)
    # As after a proxy's CROSSSLOT (see RedisBackend.refresh_many): per slot from then on.
    backend._calls().per_slot = per_slot or backend._calls().cluster
    counting = CountingRedis(backend)
    counting.nodes = nodes
    options = LockOptions.resolve(ttl=30, refresh_interval=1)
    run = secrets.token_hex(3)
    tokens = {
        f"bench-{run}-{n}": f"bench:{os.getpid()}:{secrets.token_urlsafe(18)}"
        for n in range(leases)
    }
    asked_at = clock()
    for k, t in tokens.items():
        assert backend.acquire(k, t, ttl=options.ttl, max_lifetime=options.max_lifetime)
    held = [
        Lease(backend, k, t, Holder.from_token(t), options, asked_at=asked_at)
        for k, t in tokens.items()
    ]
    for lease in held:
        heartbeat().add(lease)
    try:
        thread = heartbeat()._thread
        assert thread is not None
        assert thread.native_id is not None
        time.sleep(1.5)  # the first tick
        first, calls = len(counting.ticks), _evalsha_calls(nodes)
        reaped = len(counting.reaps)
        cpu, start = _thread_cpu_seconds(thread.native_id), time.monotonic()
        time.sleep(window)
        cpu = _thread_cpu_seconds(thread.native_id) - cpu
        elapsed = time.monotonic() - start
        steady = counting.ticks[first:]
        reaps = counting.reaps[reaped:]
        # The refreshes' scripts: the reaps' (counted around each) are shown apart.
        scripts = _evalsha_calls(nodes) - calls - sum(n for n, _ in reaps)
        lost = sum(lease.lost for lease in held)
    finally:
        for lease in held:
            heartbeat().remove(lease)
    batch = backend._batch
    floor = None
    if not backend._calls().cluster and batch is not None and batch.packed:
        floor = _raw_floor(url, batch.packed, window)
    return {
        "raw_floor_cpu_percent": floor,
        "leases": leases,
        "ticks": len(steady),
        "scripts_per_tick": round(scripts / max(1, len(steady)), 1),
        "tick_ms_median": round(1000 * statistics.median(s for _, s in steady), 1)
        if steady
        else None,
        "thread_cpu_percent": round(100 * cpu / elapsed, 1),
        "reaps": len(reaps),
        "reap_scripts": sum(n for n, _ in reaps),
        "reap_seconds": round(sum(t for _, t in reaps), 3),
        "lost": lost,
    }


def _raw_floor(url: str, packed: list[bytes], window: float) -> float:
    """Percent of a core a thread of redis-py uses to send the heartbeat's last tick
    (``packed``: its ``EVALSHA`` calls as sent) every second for ``window`` s, and
    read the replies, on one connection: the same calls and nothing else."""
    import threading

    import redis

    client = redis.Redis.from_url(url)
    share: list[float] = []

    def send() -> None:
        conn = client.connection_pool.get_connection()
        try:
            native = threading.get_native_id()
            cpu, start = _thread_cpu_seconds(native), time.monotonic()
            next_at = start
            while time.monotonic() - start < window:
                conn.send_packed_command(packed)
                for _ in packed:
                    conn.read_response()
                next_at += 1.0
                time.sleep(max(0.0, next_at - time.monotonic()))
            share.append(100 * (_thread_cpu_seconds(native) - cpu) / (time.monotonic() - start))
        finally:
            client.connection_pool.release(conn)

    thread = threading.Thread(target=send, name="bench-raw-heartbeat")
    thread.start()
    thread.join()
    client.close()
    return round(share[0], 1)


def section(results: dict[str, Any], load: float, cores: int, loaded: bool) -> str:
    """The run as docs/speed.md shows it: who ran it, the table, what slots apart cost."""
    busy = " (a busy machine: published with `--loaded`)" if loaded else ""
    run = results["cluster"]
    lines = [
        f"One run ({run['leases']:,} leases, {run['ticks']} ticks measured on the cluster) on "
        f"{cores} cores, load average {load:.2f} (1 min) before it{busy}:",
        "",
        "| storage | scripts per tick | median tick | heartbeat thread CPU | raw floor "
        "| reaps (scripts, time) | lost |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in ROWS.items():
        run = results[name]
        scripts = run["scripts_per_tick"]  # a tick cut by the window's edges: approximate
        shown = f"about {round(scripts, -2):,.0f}" if scripts >= 1000 else f"{scripts:,.0f}"
        tick = "-" if run["tick_ms_median"] is None else f"{run['tick_ms_median']:.0f} ms"
        cpu = f"{run['thread_cpu_percent']:.1f} % of a core"
        raw = run.get("raw_floor_cpu_percent")
        floor = "-" if raw is None else f"{raw:.1f} %"
        reaps = f"{run['reaps']} ({run['reap_scripts']:,}, {run['reap_seconds']:.2f} s)"
        lines.append(f"| {label} | {shown} | {tick} | {cpu} | {floor} | {reaps} | {run['lost']} |")
    apart = results["single_per_slot"]["thread_cpu_percent"]
    together = max(results["single"]["thread_cpu_percent"], 0.1)
    lines += [
        "",
        f"On one Redis, keeping slots apart cost {apart / together:.1f} times the heartbeat "
        "thread's CPU of one script per 500 leases in this run.",
    ]
    return "\n".join(lines)


def publish(text: str) -> None:
    page = SPEED.read_text()
    head, begin, rest = page.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{SPEED} has no {BEGIN} ... {END}")
    SPEED.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    print(f"published in {SPEED}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--publish", action="store_true", help="into docs/speed.md")
    parser.add_argument("--loaded", action="store_true", help="publish a busy machine's run")
    args = parser.parse_args()
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if args.publish and load / cores > IDLE_PER_CORE and not args.loaded:
        raise SystemExit(
            f"load average {load:.2f} on {cores} cores: above {IDLE_PER_CORE} per core, "
            "so not published (--loaded publishes it anyway, saying so)"
        )
    settings.configure(USE_TZ=True, INSTALLED_APPS=["django_tasklock"])
    django.setup()
    from tests.support.cluster import PrivateCluster
    from tests.support.servers import PrivateRedis

    results: dict[str, Any] = {}
    cluster = PrivateCluster()
    try:
        cluster.start()
        masters = [cluster.node(port) for port in cluster.masters()]
        results["cluster"] = measure(cluster.url, masters, args.leases, args.window)
    finally:
        cluster.stop()
    single = PrivateRedis()
    try:
        single.start()
        import redis

        node = redis.Redis(port=single.port)
        results["single"] = measure(single.url, [node], args.leases, args.window)
        results["single_per_slot"] = measure(
            single.url, [node], args.leases, args.window, per_slot=True
        )
        node.close()
    finally:
        single.stop()
    print(json.dumps(results, indent=2))
    if args.publish:
        publish(section(results, load, cores, load / cores > IDLE_PER_CORE))


if __name__ == "__main__":
    main()
