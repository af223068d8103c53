"""What a run prints and writes: the table, ``results.json`` and the chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from timing import Samples

#: The ratios docs/speed.md quotes: ours / other, both measured in the same rounds.
RATIOS = {
    "postgres_vs_orm_floor": ("postgres", "orm_floor"),
    "sqlite_vs_orm_floor": ("sqlite", "orm_floor"),
    "mariadb_vs_orm_floor": ("mariadb", "orm_floor"),
    "postgres_vs_raw": ("postgres", "raw"),
    "postgres_vs_django_db_mutex": ("postgres", "django_db_mutex"),
    "postgres_vs_django_pglock": ("postgres", "django_pglock"),
    "sqlite_vs_raw": ("sqlite", "raw"),
    "mariadb_vs_raw": ("mariadb", "raw"),
    "redis_vs_raw": ("redis", "raw"),
    "redis_vs_redis_py_lock": ("redis", "redis_py_lock"),
    "redis_vs_python_redis_lock": ("redis", "python_redis_lock"),
    # The mutex's cycle against ours with limit=3 (a permit per cycle).
    "postgres_vs_limit3": ("postgres", "limit3"),
    "sqlite_vs_limit3": ("sqlite", "limit3"),
    "mariadb_vs_limit3": ("mariadb", "limit3"),
    "redis_vs_limit3": ("redis", "limit3"),
}


def contenders_table(groups: dict[str, dict[str, Samples]]) -> list[dict[str, Any]]:
    rows = []
    for group, samples in groups.items():
        for name, sample in samples.items():
            rows.append(
                {
                    "backend": group,
                    "contender": name,
                    "label": sample.contender.label,
                    "cycles_per_s": round(sample.median, 1),
                    "samples": [round(rate, 1) for rate in sample.rates],
                    "cpu_us_per_cycle": round(sorted(sample.cpu_us)[len(sample.cpu_us) // 2], 1),
                    "cpu_us_samples": [round(cpu, 1) for cpu in sample.cpu_us],
                    "note": sample.contender.note,
                }
            )
    return rows


def _print_timed(timed: dict[str, Any], title: str) -> None:
    print(f"\n{title}")
    print(f"{'backend':<9} {'contender':<32} {'CPU us/cycle':>13} {'cycles/s':>10}")
    for row in timed["contenders"]:
        print(
            f"{row['backend']:<9} {row['label']:<32} {row['cpu_us_per_cycle']:>13,.0f} "
            f"{row['cycles_per_s']:>10,.0f}"
        )
    print("ratios, ours / other (median of per-round ratios):  CPU   wall")
    for name, value in timed["ratios"].items():
        cpu = timed["cpu_ratios"][name]
        if value is not None:
            print(f"  {name:<30} {'':>17} {cpu:>5.2f} {value:>6.2f}")


def print_report(report: dict[str, Any]) -> None:
    _print_timed(report, "on loopback (CPU: cycles per CPU second; wall: cycles/s)")
    for name, block in report.items():
        if name.startswith("latency_"):
            _print_timed(block, f"{block['added_ms_per_request']:g} ms away ({name})")
    load = report.get("load")
    if load:
        print(
            f"\nload average (1 min) before {load['before']['1min']}, after "
            f"{load['after']['1min']}, on {load['before']['cores']} cores"
        )
    heartbeat = report.get("heartbeat") or {}
    for label, run in (("500", heartbeat), ("10,000", heartbeat.get("locks_10000"))):
        if run:
            print(
                f"heartbeat, {label} leases: {run['statements_per_tick']} statements/tick, "
                f"thread CPU {run['thread_cpu_percent']} % (raw driver, same statements: "
                f"{run.get('raw_floor_cpu_percent')} %), lost {run['lost']}"
            )
    for name, run in (report.get("release") or {}).items():
        print(
            f"release p99 at {name}: {run['p99_ms']} ms "
            f"(raw DELETE p50 {run['round_trip_p50_ms']} ms, p99 {run['round_trip_p99_ms']} ms)"
        )
    for name, reason in report["skipped"].items():
        print(f"SKIPPED {name}: {reason}")


def write_json(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")


def write_chart(report: dict[str, Any], path: Path) -> None:
    """Per storage, ours first: CPU per cycle, cycles/s on loopback, and cycles/s far away."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (report["contenders"], "cpu_us_per_cycle", "CPU us per cycle (lower is better)"),
        (report["contenders"], "cycles_per_s", "cycles/s on loopback"),
    ]
    for name, block in report.items():
        if name.startswith("latency_"):
            ms = block["added_ms_per_request"]
            panels.append((block["contenders"], "cycles_per_s", f"cycles/s, {ms:g} ms away"))
    groups = list(dict.fromkeys(row["backend"] for row in report["contenders"]))
    colours = {"ours": "#2b7bba", "raw": "#9a9a9a", "orm_floor": "#c7c7c7"}
    fig, axes = plt.subplots(
        len(panels),
        len(groups),
        figsize=(3.2 * len(groups) + 1, 3.4 * len(panels)),
        squeeze=False,
    )
    for line, (rows, field, ylabel) in zip(axes, panels, strict=True):
        for axis, group in zip(line, groups, strict=True):
            mine = [row for row in rows if row["backend"] == group]
            if not mine:
                axis.set_axis_off()
                continue
            labels = [row["label"].replace(" ", "\n", 1) for row in mine]
            values = [row[field] for row in mine]
            bars = axis.bar(
                range(len(mine)),
                values,
                color=[colours.get(r["contender"], "#e08a3c") for r in mine],
            )
            axis.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7)
            axis.set_xticks(range(len(mine)), labels, fontsize=6, rotation=30, ha="right")
            axis.set_title(group, fontsize=9)
            axis.set_ylabel(ylabel if group == groups[0] else "", fontsize=8)
    fig.suptitle(
        "django-tasklock (blue) vs the ORM floor and raw driver (grey) and peers (orange), "
        "one run",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
