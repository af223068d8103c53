"""What a run prints and writes: the table, ``results.json`` and the chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from timing import Samples

#: The ratios docs/speed.md quotes: ours / other, both measured in the same rounds.
RATIOS = {
    "postgres_vs_raw": ("postgres", "raw"),
    "postgres_vs_django_db_mutex": ("postgres", "django_db_mutex"),
    "postgres_vs_django_pglock": ("postgres", "django_pglock"),
    "sqlite_vs_raw": ("sqlite", "raw"),
    "mariadb_vs_raw": ("mariadb", "raw"),
    "redis_vs_raw": ("redis", "raw"),
    "redis_vs_redis_py_lock": ("redis", "redis_py_lock"),
    "redis_vs_python_redis_lock": ("redis", "python_redis_lock"),
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
                    "note": sample.contender.note,
                }
            )
    return rows


def print_report(report: dict[str, Any]) -> None:
    print(f"\n{'backend':<9} {'contender':<32} {'cycles/s':>10} {'CPU us/cycle':>13}")
    for row in report["contenders"]:
        print(
            f"{row['backend']:<9} {row['label']:<32} {row['cycles_per_s']:>10,.0f} "
            f"{row['cpu_us_per_cycle']:>13,.0f}"
        )
    print("\nratios (ours / other, median of per-round ratios):")
    for name, value in report["ratios"].items():
        print(f"  {name:<30} {'-' if value is None else f'{value:.2f}'}")
    heartbeat = report.get("heartbeat") or {}
    for label, run in (("500", heartbeat), ("10,000", heartbeat.get("locks_10000"))):
        if run:
            print(
                f"heartbeat, {label} leases: {run['statements_per_tick']} statements/tick, "
                f"thread CPU {run['thread_cpu_percent']} %, lost {run['lost']}"
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
    """Cycles/s of every contender, grouped by storage, ours first in each group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["contenders"]
    groups = list(dict.fromkeys(row["backend"] for row in rows))
    colours = {"ours": "#2b7bba", "raw": "#9a9a9a"}
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups) + 1, 4.2), squeeze=False)
    for axis, group in zip(axes[0], groups, strict=True):
        mine = [row for row in rows if row["backend"] == group]
        labels = [row["label"].replace(" ", "\n", 1) for row in mine]
        values = [row["cycles_per_s"] for row in mine]
        bars = axis.bar(
            range(len(mine)), values, color=[colours.get(r["contender"], "#e08a3c") for r in mine]
        )
        axis.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7)
        axis.set_xticks(range(len(mine)), labels, fontsize=7, rotation=30, ha="right")
        axis.set_title(group)
        axis.set_ylabel("acquire + release cycles/s" if group == groups[0] else "")
    fig.suptitle(
        "django-tasklock (blue) vs the raw floor (grey) and peers (orange), one run", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
