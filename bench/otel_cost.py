"""What OpenTelemetry costs per lock cycle: CPU per cycle in one run, three ways.

- ``off``: no observer, as without the ``otel`` extra (or with it installed and
  ``TASKLOCK_OPENTELEMETRY`` unset): the lock's steps find ``observe.observer`` None;
- ``api``: ``TASKLOCK_OPENTELEMETRY = True`` with ``opentelemetry-api`` only and no SDK
  configured: every span and instrument is OpenTelemetry's no-op;
- ``sdk``: the SDK's ``TracerProvider`` (spans sampled, batched to an exporter that
  drops them) and ``MeterProvider`` (every metric aggregated).

Each round times the three in a rotating order on the same contender (``ours``:
``run_exclusive`` with a no-op body), on the memory backend (the lock's own CPU,
no storage) and on SQLite. ``python bench/otel_cost.py`` runs it alone; ``run.py``
adds it to results.json as ``otel``.
"""

from __future__ import annotations

import gc
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import servers
from servers import Servers, log

MODES = ("off", "api", "sdk")


def _observers() -> dict[str, Any] | str:
    """The observer of each mode, or why they cannot be made here."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        from django_tasklock.contrib import otel
    except ImportError as exc:
        return f"{exc} (pip install -e '.[test]')"

    class Drop(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Drop()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def flush() -> None:
        # Neither the batch's own thread nor the garbage the SDK made may bill the
        # next sample: flushed and collected after each.
        tracer_provider.force_flush()
        gc.collect()

    return {
        "flush": flush,
        "off": None,
        # No provider given and none set globally: OpenTelemetry's no-op proxies.
        "api": otel.Telemetry(),
        "sdk": otel.Telemetry(tracer_provider, meter_provider),
    }


def cost(up: Servers, seconds: float, repeat: int) -> dict[str, Any]:
    """CPU us per cycle and cycles/s of each mode (medians over rounds), per backend."""
    import timing
    from contenders import ours

    from django_tasklock.backends.database import DatabaseBackend
    from django_tasklock.backends.memory import MemoryBackend
    from django_tasklock.leases import observe

    observers = _observers()
    if isinstance(observers, str):
        log(f"  otel: skipped: {observers}")
        return {"skipped": observers}
    contenders = [ours("memory", MemoryBackend())]
    if "sqlite" in up.aliases:
        contenders.append(ours("sqlite", DatabaseBackend(using=up.aliases["sqlite"])))
    out: dict[str, Any] = {}
    try:
        for contender in contenders:
            for mode in MODES:  # warm-up
                observe.install(observers[mode])
                timing.cycles_per_second(contender, seconds / 2)
                observers["flush"]()
            cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
            rate: dict[str, list[float]] = {mode: [] for mode in MODES}
            for number in range(repeat):
                shift = number % len(MODES)
                for mode in MODES[shift:] + MODES[:shift]:
                    observe.install(observers[mode])
                    per_second, cpu_us = timing.cycles_per_second(contender, seconds)
                    observers["flush"]()
                    rate[mode].append(per_second)
                    cpu[mode].append(cpu_us)
            out[contender.group] = {
                mode: {
                    "cpu_us_per_cycle": round(statistics.median(cpu[mode]), 1),
                    "cycles_per_s": round(statistics.median(rate[mode])),
                    # Median over rounds of this mode's CPU / off's, both in that round.
                    "cpu_vs_off": round(
                        statistics.median(
                            a / b for a, b in zip(cpu[mode], cpu["off"], strict=True)
                        ),
                        3,
                    ),
                }
                for mode in MODES
            }
            log(
                f"  otel on {contender.group}: "
                + ", ".join(
                    f"{mode} {row['cpu_us_per_cycle']} us/cycle (x{row['cpu_vs_off']})"
                    for mode, row in out[contender.group].items()
                )
            )
    finally:
        observe.install(None)
    return out


def main(argv: list[str]) -> int:
    seconds = float(argv[0]) if argv else 1.0
    repeat = int(argv[1]) if len(argv) > 1 else 7
    with servers.started(["sqlite"]) as up:
        import logging

        logging.getLogger("django_tasklock").setLevel(logging.ERROR)
        cost(up, seconds, repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
