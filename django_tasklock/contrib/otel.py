"""OpenTelemetry spans and metrics for every lock (extra ``otel``: ``opentelemetry-api``).

``TASKLOCK_OPENTELEMETRY = True`` calls :func:`enable` when Django starts; the
project brings the SDK and its exporter. Spans: ``tasklock.acquire`` (the parent
of the storage calls the psycopg and redis instrumentations trace),
``tasklock.hold`` (grant to release), ``tasklock.heartbeat`` (one tick). Metrics:
see :data:`METRICS`. Attributes are the lock's ``name`` (never its key), its
backend, and the outcome: a bounded set, whatever the keys.
"""

from __future__ import annotations

from django_tasklock.contrib import require

require("otel")

import re  # noqa: E402
import time  # noqa: E402 - after require(): a missing extra says so first
import traceback  # noqa: E402
import weakref  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import AbstractContextManager, contextmanager, nullcontext  # noqa: E402
from types import TracebackType  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from opentelemetry import context, metrics, trace  # noqa: E402
from opentelemetry.trace import SpanKind, Status, StatusCode  # noqa: E402

from django_tasklock.contrib.otel_conventions import (  # noqa: E402
    METRICS,
    SCOPE,
    SECONDS,
    backend_name,
)
from django_tasklock.leases import observe  # noqa: E402
from django_tasklock.leases.lease import clock  # noqa: E402

if TYPE_CHECKING:
    from opentelemetry.util.types import Attributes

    from django_tasklock.backends.base import BaseBackend
    from django_tasklock.leases.lease import Lease


class Telemetry:
    """The observer (see ``django_tasklock.leases.observe``) that turns lock steps into spans
    and metrics, through the given providers or OpenTelemetry's global ones."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)

        def histogram(name: str) -> metrics.Histogram:
            _, unit, description = METRICS[name]
            bounds = SECONDS if unit == "s" else None
            return meter.create_histogram(
                name, unit, description, explicit_bucket_boundaries_advisory=bounds
            )

        def counter(name: str) -> metrics.Counter:
            return meter.create_counter(name, *METRICS[name][1:])

        def up_down(name: str) -> metrics.UpDownCounter:
            return meter.create_up_down_counter(name, *METRICS[name][1:])

        self.acquire_duration = histogram("tasklock.acquire.duration")
        self.hold_duration = histogram("tasklock.hold.duration")
        self.active = up_down("tasklock.active")
        self.waiting = up_down("tasklock.waiting")
        self.lost = counter("tasklock.lost")
        self.skips = counter("tasklock.skipped")
        self.beat_duration = histogram("tasklock.heartbeat.duration")
        self.beat_leases = histogram("tasklock.heartbeat.leases")
        self._holds: weakref.WeakKeyDictionary[Lease, _Hold] = weakref.WeakKeyDictionary()
        #: Through the global providers: idle (no span, no measurement) until a project
        #: sets one, so that the extra without an SDK costs a lock next to nothing.
        self._idle = tracer_provider is None and meter_provider is None
        self._look_again = 0.0  # time.monotonic() when to look for them again

    def live(self) -> bool:
        """Whether spans and measurements go anywhere: providers were given, or set
        globally (looked for at most once a second: a lock step must stay cheap)."""
        if not self._idle:
            return True
        now = time.monotonic()
        if now < self._look_again:
            return False
        self._look_again = now + 1.0
        self._idle = not _global_providers_set()  # a global provider cannot be unset
        return not self._idle

    @staticmethod
    def attributes(lock: observe.ObservedLock, backend: BaseBackend) -> dict[str, str]:
        """``tasklock.name`` (when the lock has one) and ``tasklock.backend``."""
        found = {"tasklock.backend": backend_name(backend)}
        if lock.name is not None:
            found["tasklock.name"] = lock.name
        return found

    # -- the observer ------------------------------------------------------------

    def acquiring(self, lock: observe.ObservedLock, backend: BaseBackend) -> observe.Acquisition:
        if not self.live():
            return _IDLE
        return _Acquisition(self, lock, self.attributes(lock, backend))

    def released(self, lease: Lease) -> None:
        hold = self._holds.pop(lease, None) if self._holds else None
        if hold is not None:
            hold.end()

    def skipped(self, lock: observe.ObservedLock, outcome: str) -> None:
        if self.live():
            found = self.attributes(lock, lock.backend)
            found["tasklock.skipped.outcome"] = outcome
            self.skips.add(1, found)

    def heartbeat(self, leases: list[Lease]) -> AbstractContextManager[object]:
        return self._tick(leases) if self.live() else nullcontext()

    @contextmanager
    def _tick(self, leases: list[Lease]) -> Iterator[None]:
        found: Attributes = {"tasklock.backend": backend_name(leases[0].backend)}
        started = clock()
        with self.tracer.start_as_current_span(
            "tasklock.heartbeat", kind=SpanKind.INTERNAL, attributes=found
        ) as span:
            try:
                yield
            finally:
                # A lease the tick refreshed was answered "still ours" since it began.
                refreshed = sum(1 for lease in leases if lease.answered_at >= started)
                span.set_attribute("tasklock.heartbeat.leases", refreshed)
                self.beat_duration.record(clock() - started, found)
                self.beat_leases.record(refreshed, found)

    def held(self, lock: observe.ObservedLock, found: dict[str, str]) -> None:
        """The grant: a hold starts, ended by :meth:`released` (or never, in a forked child)."""
        lease = lock._lease
        assert lease is not None
        hold = _Hold(self, found, lock.fence, lease.asked_at)
        if lease.permit is not None:  # one of a limit=N key's permits
            hold.span.set_attribute("tasklock.limit", lock.limit)
            hold.span.set_attribute("tasklock.permit", lease.permit)
        self._holds[lease] = hold
        lease.on_loss(hold.lose)


class _Acquisition:
    def __init__(
        self, telemetry: Telemetry, lock: observe.ObservedLock, found: dict[str, str]
    ) -> None:
        self.telemetry = telemetry
        self.lock = lock
        self.found = found
        self.acquired = False
        self.waits = False

    def __enter__(self) -> _Acquisition:
        self.started = time.perf_counter()
        self.span = self.telemetry.tracer.start_span(
            "tasklock.acquire", kind=SpanKind.INTERNAL, attributes=self.found
        )
        if self.lock.limit > 1:  # on spans only: metrics keep their series
            self.span.set_attribute("tasklock.limit", self.lock.limit)
        self.token = context.attach(trace.set_span_in_context(self.span))
        return self

    def waiting(self) -> None:
        if not self.waits:
            self.waits = True
            self.telemetry.waiting.add(1, self.found)

    def granted(self, acquired: bool) -> bool:
        self.acquired = acquired
        return acquired

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        context.detach(self.token)
        telemetry, span = self.telemetry, self.span
        if self.waits:
            telemetry.waiting.add(-1, self.found)
        if exc is not None:
            result = "error"
            _record_error(span, exc, self.lock.key)
        elif self.acquired:
            result = "acquired"
            if self.lock.fence is not None:
                span.set_attribute("tasklock.fence", self.lock.fence)
        else:
            # "Held elsewhere" is an answer, not an error: the span's status stays unset.
            result = "timeout" if self.lock.wait else "held_elsewhere"
        span.set_attribute("tasklock.result", result)
        span.end()
        telemetry.acquire_duration.record(
            time.perf_counter() - self.started, {**self.found, "tasklock.result": result}
        )
        if self.acquired and exc is None:
            telemetry.held(self.lock, self.found)


class _Idle:
    """The acquisition while nothing is configured: no span, no measurement."""

    def __enter__(self) -> _Idle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def waiting(self) -> None:
        return None

    def granted(self, acquired: bool) -> bool:
        return acquired


_IDLE = _Idle()


def _global_providers_set() -> bool:
    """Whether the project set a global tracer or meter provider (the SDK's, usually).

    Unset, OpenTelemetry hands out proxies; ``_ProxyMeterProvider`` is private, so it
    is told by name: renamed one day, this says True, and locks are merely measured
    through the proxies.
    """
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return True
    return type(metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider"


class _Hold:
    """``tasklock.hold``; ``tasklock.hold.duration`` from the grant (``asked_at``) to the
    release, on :func:`clock`, which counts a suspend as the storage's clock does."""

    def __init__(
        self, telemetry: Telemetry, found: dict[str, str], fence: int | None, asked_at: float
    ) -> None:
        self.telemetry = telemetry
        self.found = found
        self.started = asked_at
        self.span = telemetry.tracer.start_span(
            "tasklock.hold", kind=SpanKind.INTERNAL, attributes=found
        )
        if fence is not None:
            self.span.set_attribute("tasklock.fence", fence)
        telemetry.active.add(1, found)

    def lose(self, lease: Lease) -> None:
        """At the declaration of the loss, on the declaring thread: quick, never blocks."""
        reason = lease.reason or "unknown"
        self.telemetry.lost.add(1, {**self.found, "tasklock.lost.reason": reason})
        self.span.set_attribute("tasklock.lost.reason", reason)
        self.span.set_attribute("error.type", reason)
        self.span.set_status(Status(StatusCode.ERROR, f"lease lost: {reason}"))

    def end(self) -> None:
        self.telemetry.active.add(-1, self.found)
        self.telemetry.hold_duration.record(clock() - self.started, self.found)
        self.span.end()


def _record_error(span: trace.Span, exc: BaseException, key: str) -> None:
    """Status ERROR, ``error.type`` and the exception event, its text without ``key``.

    An error may name the key (``ReplicationNotConfirmed`` does): the span must not.
    """

    # One pass (no "<key>" rewritten again); a key that starts or ends with a word
    # character only where it is not part of a longer word ("e" in "acquired").
    before = r"(?<!\w)" if re.match(r"\w", key[:1]) else ""
    after = r"(?!\w)" if re.match(r"\w", key[-1:]) else ""
    found = re.compile(f"{re.escape(repr(key))}|{before}{re.escape(key)}{after}")

    def keyless(text: str) -> str:
        return found.sub("<key>", text)

    message = keyless(str(exc))
    trace_text = keyless("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    span.record_exception(exc, {"exception.message": message, "exception.stacktrace": trace_text})
    span.set_status(Status(StatusCode.ERROR, message))
    span.set_attribute("error.type", _qualified(type(exc)))


def _qualified(cls: type[BaseException]) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"


def enable(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> Telemetry:
    """Trace and measure every lock from now on, through these providers (default:
    OpenTelemetry's global ones, which may be set later: the SDK's, once configured)."""
    telemetry = Telemetry(tracer_provider, meter_provider)
    observe.install(telemetry)
    return telemetry


def disable() -> None:
    """Stop tracing and measuring locks (holds under way are left unfinished)."""
    observe.install(None)
