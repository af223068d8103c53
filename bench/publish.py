"""Put a run's numbers in the docs: the tables of docs/speed.md and the README's Speed section.

    python bench/run.py && python bench/publish.py    # on an otherwise idle machine

Reads ``bench/results.json`` (or ``--results``) and rewrites what lies between
``<!-- speed:begin -->`` and ``<!-- speed:end -->`` in docs/speed.md, and the
README's ``## Speed`` section (added before ``## Development`` the first time).
The README gets one compact table (ratios only, both scenarios side by side).
Refuses a run whose load average (1 min) before it was above 0.3 per core,
unless ``--loaded``. The load after it is shown but not judged: it counts the
run itself (its client and the database servers it kept busy for minutes).
On a busy machine every contender waits on a CPU-starved server and the wall
ratios look closer than they are.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
IDLE_PER_CORE = 0.3
BEGIN, END = "<!-- speed:begin -->", "<!-- speed:end -->"
HANDOFF = ("<!-- handoff:begin -->", "<!-- handoff:end -->")

#: ratio name -> (storage, what ours is measured against)
AGAINST = {
    "postgres_vs_orm_floor": ("PostgreSQL", "ORM floor: `objects.create()` + the same DELETE"),
    "postgres_vs_raw": ("PostgreSQL", "raw psycopg, the same SQL"),
    "postgres_vs_django_db_mutex": ("PostgreSQL", "django-db-mutex"),
    "postgres_vs_django_pglock": (
        "PostgreSQL",
        "django-pglock advisory lock (no TTL, no heartbeat, held by the connection)",
    ),
    "sqlite_vs_orm_floor": ("SQLite", "ORM floor"),
    "sqlite_vs_raw": ("SQLite", "raw `sqlite3`, the same SQL"),
    "mariadb_vs_orm_floor": ("MariaDB", "ORM floor"),
    "mariadb_vs_raw": ("MariaDB", "raw mysqlclient, the same SQL"),
    "redis_vs_raw": ("Redis", "raw redis-py `SET NX PX` + EVALSHA compare-and-delete"),
    "redis_vs_redis_py_lock": ("Redis", "redis-py `Lock` (no heartbeat)"),
    "redis_vs_python_redis_lock": ("Redis", "python-redis-lock, `auto_renewal=True`"),
    "postgres_vs_limit3": ("PostgreSQL", "ours with `limit=3` (a permit per cycle)"),
    "sqlite_vs_limit3": ("SQLite", "ours with `limit=3`"),
    "mariadb_vs_limit3": ("MariaDB", "ours with `limit=3`"),
    "redis_vs_limit3": ("Redis", "ours with `limit=3`"),
}


def _cpu(block: dict[str, Any], name: str) -> str:
    """``ours / theirs`` CPU us per cycle of one ratio's two contenders."""
    group, _, other = name.partition("_vs_")
    us = {(r["backend"], r["contender"]): r["cpu_us_per_cycle"] for r in block["contenders"]}
    ours, theirs = us.get((group, "ours")), us.get((group, other))
    return "-" if ours is None or theirs is None else f"{ours:,.0f} / {theirs:,.0f}"


def table(block: dict[str, Any]) -> str:
    lines = [
        "| storage | ours against | CPU µs per cycle, ours / theirs | ratio, CPU | ratio, wall |",
        "|---|---|---|---|---|",
    ]
    for name, (storage, against) in AGAINST.items():
        wall, cpu = block["ratios"].get(name), block.get("cpu_ratios", {}).get(name)
        if wall is None or cpu is None:
            continue
        lines.append(f"| {storage} | {against} | {_cpu(block, name)} | {cpu:.2f} | {wall:.2f} |")
    return "\n".join(lines)


def machine(result: dict[str, Any]) -> str:
    load, versions = result["load"], result["versions"]
    servers = ", ".join(
        f"{label} {versions[name].removeprefix(label).strip().split(' (')[0].split('-')[0]}"
        for name, label in (
            ("postgres server", "PostgreSQL"),
            ("mariadb server", "MariaDB"),
            ("redis server", "Redis"),
        )
        if name in versions
    )
    cores = load["before"]["cores"]
    worst = load["before"]["per_core_1min"]
    idle = (
        f"an otherwise idle machine (under {IDLE_PER_CORE} per core before the run; the "
        "load after it is the run's own)"
        if worst <= IDLE_PER_CORE
        else "a busy machine, where the wall ratios look closer than they are"
    )
    return (
        f"One `python bench/run.py` run, {result['settings']['date']}, on {cores} "
        f"cores with a load average of {load['before']['1min']} before and "
        f"{load['after']['1min']} after (1 min): {idle}; Python {versions['python']}, Django "
        f"{versions['Django']}; {servers}, on loopback TCP; SQLite {versions.get('sqlite server')}"
        " on a file."
    )


def heartbeat(result: dict[str, Any]) -> str:
    beat = result.get("heartbeat")
    if not beat:
        return ""
    many = beat["locks_10000"]
    return (
        f"**Heartbeat** (PostgreSQL, ttl 30 s, refresh every {many['refresh_interval_s']:g} s): "
        f"10,000 leases, {many['statements_per_tick']} statements per tick, the heartbeat "
        f"thread using {many['thread_cpu_percent']} % of a core{floor(many)}, "
        f"{many['lost']} lost; 500 leases, {beat['statements_per_tick']} statement per tick, "
        f"{beat['thread_cpu_percent']} %{floor(beat)}." + release(result)
    )


def floor(run: dict[str, Any]) -> str:
    """The raw driver sending the same statements, beside the heartbeat (if measured)."""
    raw = run.get("raw_floor_cpu_percent")
    if raw is None:
        return ""
    # /proc counts CPU in ticks (10 ms): a floor of less than a tick per 10 s reads 0.
    share = f"{raw} %, {run['thread_cpu_percent'] / raw:.1f} times" if raw else "under 0.1 %"
    return f" (the raw driver sending the same statements at the same interval: {share})"


def release(result: dict[str, Any]) -> str:
    runs = result.get("release") or {}
    if len(runs) != 3:
        return ""
    ours = " / ".join(f"{run['p99_ms']:g}" for run in runs.values())
    raw = " / ".join(f"{run['round_trip_p99_ms']:g}" for run in runs.values())
    return (
        f" Release p99 while 500 other leases are refreshed: {ours} ms at refresh intervals "
        f"of 0.5 / 5 / 50 s, against {raw} ms for the same DELETE sent raw."
    )


STORAGES = {
    "postgres": "PostgreSQL",
    "redis": "Redis",
    "mariadb": "MariaDB",
    "sqlite": "SQLite (a file)",
}


def handoff(result: dict[str, Any]) -> str:
    """The handoff table: p50 / p99 per storage, waiters and hold; the floors; the spread."""
    block = result.get("handoff")
    if not block:
        return ""
    lines = [
        "| storage | waiters | hold | handoff p50 | p99 | from the release's start, p50 / p99 "
        "| holds per participant (min-max) | longest wait |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for group, name in STORAGES.items():
        for label, run in (block.get(group) or {}).items():
            waiters, hold = label.removeprefix("waiters_").split("_hold_")
            seconds = float(hold.removesuffix("s"))
            held = f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"
            spread = run["holds_per_participant"]
            lines.append(
                f"| {name} | {waiters} | {held} | {run['p50_ms']:g} ms | {run['p99_ms']:g} ms "
                f"| {run['from_release_start_p50_ms']:g} / {run['from_release_start_p99_ms']:g}"
                f" ms | {spread['min']}-{spread['max']} | {run['longest_wait_s']:g} s |"
            )
    floors = {
        "raw_pg_advisory_lock": "PostgreSQL `pg_advisory_lock` (waiter blocked in the server)",
        "raw_pg_notify_1": "PostgreSQL row and `LISTEN`/`NOTIFY`, raw driver",
        "raw_pg_notify_8": "PostgreSQL row and `LISTEN`/`NOTIFY`, raw driver",
        "raw_pg_notify_8_one_acts": "PostgreSQL row and `LISTEN`/`NOTIFY`, raw driver, "
        "only one waiter acts",
        "raw_redis_pubsub": "Redis `PUBLISH` to a subscribed waiter, then `SET NX`",
    }
    for name, what in floors.items():
        run = block.get(name)
        if run:
            waiters = 8 if "_8" in name else 1
            lines.append(
                f"| {what} | {waiters} | 50 ms | {run['p50_ms']:g} ms | {run['p99_ms']:g} ms "
                f"| {run['from_release_start_p50_ms']:g} / {run['from_release_start_p99_ms']:g}"
                " ms | - | - |"
            )
    return "\n".join(lines)


def section(result: dict[str, Any], chart: str) -> str:
    """The generated text: the chart, both tables, the machine, the heartbeat."""
    ratios = (
        "Ratios are medians over interleaved rounds of ours / theirs: **CPU** is cycles per "
        "CPU second (the primary figure: other processes hardly move it), **wall** is "
        "cycles per second. 1.0 means as fast; above 1, faster."
    )
    parts = [f"![CPU per cycle and cycles/s of each contender]({chart})", ratios]
    parts += ["**Servers on loopback** (the same machine):", table(result)]
    for name, block in result.items():
        if name.startswith("latency_"):
            parts += [
                f"**Servers {block['added_ms_per_request']:g} ms away** (every request held "
                "by a proxy, as on another host; not SQLite, nor the PostgreSQL peers, "
                "which use the `default` database):",
                table(block),
            ]
    parts += [machine(result), heartbeat(result)]
    return "\n\n".join(part for part in parts if part)


def replace_between(text: str, body: str, markers: tuple[str, str] | None = None) -> str:
    begin, end = markers or (BEGIN, END)
    if begin not in text or end not in text:
        raise SystemExit(f"no {begin} ... {end} in the page")
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"


def compact(result: dict[str, Any]) -> str:
    """The README's table: both scenarios' ratios side by side, and the chart."""
    far = next((b for n, b in result.items() if n.startswith("latency_")), None)
    ms = f"{far['added_ms_per_request']:g} ms away" if far else "far away"
    lines = [
        "![CPU per cycle and cycles/s of each contender](bench/results.png)",
        "",
        f"| storage | ours / theirs | CPU | wall, loopback | wall, {ms} |",
        "|---|---|---|---|---|",
    ]
    for name, (storage, against) in AGAINST.items():
        wall, cpu = result["ratios"].get(name), result["cpu_ratios"].get(name)
        if wall is None or cpu is None or name.endswith("_vs_limit3"):
            continue  # the README compares with others; ours with limit=3 is in docs/speed.md
        distant = (far or {}).get("ratios", {}).get(name)
        shown = "-" if distant is None else f"{distant:.2f}"
        lines.append(f"| {storage} | {against} | {cpu:.2f} | {wall:.2f} | {shown} |")
    lines += ["", machine(result)]
    return "\n".join(lines)


def readme_section(text: str, body: str) -> str:
    block = f"## Speed\n\n{BEGIN}\n{body}\n{END}\n\nHow it is measured: [docs](docs/speed.md).\n\n"
    if "\n## Speed\n" in text:
        replaced = "\n" + block.rstrip("\n") + "\n"
        return re.sub(r"\n## Speed\n.*?(?=\n## )", lambda _: replaced, text, flags=re.S)
    return text.replace("\n## Development\n", "\n" + block + "## Development\n", 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results.json")
    parser.add_argument("--loaded", action="store_true", help="publish a busy machine's run")
    args = parser.parse_args(argv)
    result = json.loads(args.results.read_text())
    load = result.get("load")
    if load is None or "cpu_ratios" not in result:
        print("results.json predates the load and CPU figures: run bench/run.py", file=sys.stderr)
        return 1
    worst = load["before"]["per_core_1min"]  # after: the run's own load
    if worst > IDLE_PER_CORE and not args.loaded:
        print(
            f"load average {worst} per core (over {IDLE_PER_CORE}): not an idle machine; "
            "run again when it is, or pass --loaded",
            file=sys.stderr,
        )
        return 1
    docs, readme = ROOT / "docs" / "speed.md", ROOT / "README.md"
    page = replace_between(docs.read_text(), section(result, "../bench/results.png"))
    table = handoff(result)
    if table:
        page = replace_between(page, f"{table}\n\n{machine(result)}", HANDOFF)
    docs.write_text(page)
    readme.write_text(readme_section(readme.read_text(), compact(result)))
    print(f"wrote the Speed tables of {docs} and {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
