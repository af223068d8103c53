"""Where one cycle's CPU goes: cProfile of ``run_exclusive`` (or a contender) on one storage.

    python bench/hotspots.py postgres            # ours, top 30 by own time
    python bench/hotspots.py redis --contender redis_py_lock --cycles 5000
    python bench/hotspots.py sqlite --sort cumulative --limit 60

Uses the servers and scratch databases of ``bench/run.py`` (see bench/README.md).
Prints CPU us per cycle measured without the profiler first, then the profile.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import sys
import time

import servers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=("postgres", "sqlite", "mariadb", "redis"))
    parser.add_argument("--contender", default="ours", help="ours, raw, orm_floor, ...")
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--sort", default="tottime", help="pstats sort key")
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--dump", help="also write the raw profile here (for snakeviz etc.)")
    args = parser.parse_args(argv)
    with servers.started([args.backend]) as up:
        if args.backend in up.skipped:
            print(f"SKIPPED {args.backend}: {up.skipped[args.backend]}", file=sys.stderr)
            return 1
        import contenders

        logging.getLogger("django_tasklock").setLevel(logging.ERROR)
        chosen = [
            c
            for c in contenders.all_contenders(up)
            if c.group == args.backend and c.name == args.contender
        ]
        if not chosen:
            print(f"no contender {args.contender!r} for {args.backend}", file=sys.stderr)
            return 1
        op = chosen[0].op
        for _ in range(200):  # warm-up: connections, compiled statements, caches
            op()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(args.cycles):
            op()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(
            f"{args.backend} {args.contender}: {cpu * 1e6 / args.cycles:,.0f} us CPU/cycle, "
            f"{wall * 1e6 / args.cycles:,.0f} us wall/cycle ({args.cycles} cycles, unprofiled)"
        )
        # The thread's CPU clock: time spent waiting for the server is not counted.
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        for _ in range(args.cycles):
            op()
        profiler.disable()
        if args.dump:
            profiler.dump_stats(args.dump)
        stats = pstats.Stats(profiler)
        stats.strip_dirs().sort_stats(args.sort).print_stats(args.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
