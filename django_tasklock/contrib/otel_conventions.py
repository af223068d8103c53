"""The names OpenTelemetry sees: instruments, units, bucket boundaries, backend names.

Plain data (no OpenTelemetry import), for ``contrib.otel`` and for dashboards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_tasklock.backends.base import BaseBackend

SCOPE = "django_tasklock"
#: Bucket boundaries (seconds) for the duration histograms: from a local
#: acquisition (~1 ms) to a long job's hold (an hour).
SECONDS: tuple[float, ...] = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0),
)
#: name -> (kind, unit, description): what a dashboard can chart.
METRICS = {
    "tasklock.acquire.duration": ("histogram", "s", "Time to an acquisition's outcome"),
    "tasklock.hold.duration": ("histogram", "s", "Time from grant to release"),
    "tasklock.active": ("updowncounter", "{lock}", "Locks held by this process"),
    "tasklock.waiting": ("updowncounter", "{caller}", "Callers waiting for a held key"),
    "tasklock.lost": ("counter", "{lock}", "Leases lost while held"),
    "tasklock.skipped": ("counter", "{call}", "Work not run because its key was held"),
    "tasklock.heartbeat.duration": ("histogram", "s", "Time one heartbeat tick took"),
    "tasklock.heartbeat.leases": ("histogram", "{lease}", "Leases one heartbeat tick refreshed"),
}
_BUILTIN = {
    "DatabaseBackend": "database",
    "PostgresBackend": "postgres",
    "RedisBackend": "redis",
    "MemoryBackend": "memory",
}


def backend_name(backend: BaseBackend) -> str:
    """``tasklock.backend``: a built-in backend's short name, else the class's dotted path."""
    cls = type(backend)
    if cls.__module__.startswith("django_tasklock.backends.") and cls.__name__ in _BUILTIN:
        return _BUILTIN[cls.__name__]
    return f"{cls.__module__}.{cls.__qualname__}"
