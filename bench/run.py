"""Benchmark of django-tasklock: ratios against raw drivers and peer libraries, in one run.

    pip install -e '.[bench]'
    python bench/run.py            # about 3 minutes
    python bench/run.py --quick    # under a minute

Writes ``bench/results.json`` and ``bench/results.png`` (see bench/README.md).
Benchmarks are never timed asserts in the test suite: speed lives here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import servers

HERE = Path(__file__).resolve().parent
ALL = ("postgres", "sqlite", "mariadb", "redis")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short samples: under a minute")
    parser.add_argument("--backends", default=",".join(ALL), help=f"subset of {','.join(ALL)}")
    parser.add_argument("--seconds", type=float, help="one timed sample (default 1.0, quick 0.3)")
    parser.add_argument("--repeat", type=int, help="rounds (default 7, quick 3)")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.json/png go")
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=1.0,
        help="the deployment-shaped scenario: every request held this long by a proxy "
        "(default 1; 0 skips it)",
    )
    parser.add_argument(
        "--server-side-binding",
        action="store_true",
        help="PostgreSQL OPTIONS server_side_binding=True, prepare_threshold=5 (not behind "
        "PgBouncer transaction pooling)",
    )
    args = parser.parse_args(argv)
    args.backends = [name for name in args.backends.split(",") if name]
    unknown = set(args.backends) - set(ALL)
    if unknown:
        parser.error(f"unknown backends: {sorted(unknown)}")
    args.seconds = args.seconds or (0.3 if args.quick else 1.0)
    args.repeat = args.repeat or (3 if args.quick else 7)
    return args


def load() -> dict[str, Any]:
    """The machine's load average (1, 5, 15 min) and its cores: was it idle?"""
    one, five, fifteen = os.getloadavg()
    cores = os.cpu_count() or 1
    return {
        "1min": round(one, 2),
        "5min": round(five, 2),
        "15min": round(fifteen, 2),
        "per_core_1min": round(one / cores, 2),
        "cores": cores,
    }


def timed(everyone: list[Any], seconds: float, repeat: int, label: str = "") -> dict[str, Any]:
    """Each storage's contenders in interleaved rounds: the ratios and the table."""
    import report
    import timing

    groups: dict[str, dict[str, timing.Samples]] = {}
    for group in dict.fromkeys(c.group for c in everyone):
        servers.log(f"timing {group}{label} ...")
        groups[group] = timing.rounds([c for c in everyone if c.group == group], seconds, repeat)
    return {
        "ratios": {
            name: timing.ratio(groups.get(group, {}), "ours", other)
            for name, (group, other) in report.RATIOS.items()
        },
        "cpu_ratios": {
            name: timing.cpu_ratio(groups.get(group, {}), "ours", other)
            for name, (group, other) in report.RATIOS.items()
        },
        "contenders": report.contenders_table(groups),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.server_side_binding:
        servers.POSTGRES_OPTIONS.update(server_side_binding=True, prepare_threshold=5)
    before = load()
    delay = args.latency_ms / 1000 if args.latency_ms > 0 else None
    with servers.started(args.backends, delay) as up:
        import beats
        import contenders

        logging.getLogger("django_tasklock").setLevel(logging.ERROR)
        result: dict[str, Any] = timed(contenders.all_contenders(up), args.seconds, args.repeat)
        result["skipped"] = up.skipped
        if up.far_aliases or up.far_redis_url:
            far = contenders.contenders_of(up.far_aliases, up.far_redis_url)
            result[f"latency_{args.latency_ms:g}ms"] = {
                "added_ms_per_request": args.latency_ms,
                **timed(far, args.seconds, args.repeat, f" ({args.latency_ms:g} ms away)"),
            }
        alias = up.aliases.get("postgres")
        if alias is not None:
            servers.log("heartbeat ...")
            window = 3.0 if args.quick else 10.0
            result["heartbeat"] = {
                **beats.heartbeat_load(alias, 500, window=window),
                "locks_10000": beats.heartbeat_load(alias, 10_000, window=window),
            }
            servers.log("release latency ...")
            cycles = 100 if args.quick else 400
            release = {
                f"refresh_{interval:g}s": beats.release_latency(alias, interval, cycles, 500)
                for interval in (0.5, 5.0, 50.0)
            }
            result["release"] = release
            result["release_p99_ms"] = {name: run["p99_ms"] for name, run in release.items()}
        import handoff

        result["handoff"] = handoff.handoff(up, args.quick)
        servers.log("OpenTelemetry cost ...")
        import otel_cost

        result["otel"] = otel_cost.cost(up, args.seconds, args.repeat)
        result["versions"] = servers.versions(up)
        result["transport"] = servers.transport()
        result["load"] = {"before": before, "after": load()}
        result["settings"] = {
            "seconds_per_sample": args.seconds,
            "rounds": args.repeat,
            "quick": args.quick,
            "postgres_options": dict(servers.POSTGRES_OPTIONS),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    import report

    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(result, args.out / "results.json")
    report.write_chart(result, args.out / "results.png")
    report.print_report(result)
    print(f"\nwrote {args.out / 'results.json'} and {args.out / 'results.png'}")
    return 1 if result["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main())
