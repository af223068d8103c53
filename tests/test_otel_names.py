"""What telemetry calls a lock (``name=``, ``@exclusive``'s template), how many series that
makes, and how ``TASKLOCK_OPENTELEMETRY`` turns it on: without it nothing imports
OpenTelemetry and no step calls an observer."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_tasklock import TaskLockService, contrib, current_lock, exclusive, observe
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.contrib import (
    INTEGRATIONS,
    Integration,
    MissingFramework,
    otel,
    otel_conventions,
)
from tests.otel_support import Telemetry, observed

ROOT = Path(__file__).resolve().parent.parent
#: The values tasklock.result takes.
RESULTS = 4


def current_name() -> str | None:
    lock = current_lock()
    assert lock is not None
    return lock.name


def work(n: int) -> int:
    return n


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    yield from observed()


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        (3, TypeError, "name must be a str or None, not int"),
        (b"jobs", TypeError, "name must be a str or None, not bytes"),
        ("", ValueError, "name must be 1 to 255 characters, got 0"),
        ("n" * 256, ValueError, "name must be 1 to 255 characters, got 256"),
    ],
)
def test_a_bad_name_is_refused_before_anything_is_written(
    name: object, error: type[Exception], message: str
) -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    with pytest.raises(error, match=message):
        service.lock("jobs", name=name)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        service.run_exclusive("jobs", lambda: None, name=name)  # type: ignore[arg-type]
    assert backend._leases == {}


def test_exclusive_names_the_lock_by_its_template_never_the_key() -> None:
    service = TaskLockService(MemoryBackend())

    @exclusive("invoice:{pk}", service=service)
    def by_template(pk: int) -> str | None:
        return current_name()

    @exclusive(key=lambda pk: f"invoice:{pk}", service=service)
    def by_function(pk: int) -> str | None:
        return current_name()

    @exclusive(service=service)
    def bare() -> str | None:
        return current_name()

    @exclusive("invoice:{pk}", name="invoices", service=service)
    def named(pk: int) -> str | None:
        return current_name()

    assert by_template(7) == "invoice:{pk}"
    assert by_function(7) == f"{__name__}.{by_function.__qualname__}"
    assert bare() == f"{__name__}.{bare.__qualname__}"  # the key itself: no argument in it
    assert named(7) == "invoices"
    assert service.lock("invoice:7").name is None  # lock(): no name unless given


def test_an_unnamed_lock_reports_no_name(telemetry: Telemetry) -> None:
    with TaskLockService(MemoryBackend()).lock("invoice:7"):
        pass
    for span in telemetry.spans.get_finished_spans():
        assert "tasklock.name" not in (span.attributes or {})
        assert "invoice:7" not in (span.attributes or {}).values()


def test_ten_thousand_keys_under_three_templates_make_few_series(telemetry: Telemetry) -> None:
    backend = MemoryBackend()
    service = TaskLockService(backend)
    templates = ("invoice:{n}", "report:{n}", "mail:{n}")
    functions = [exclusive(template, service=service)(work) for template in templates]
    for n in range(10_000):
        if n % 100 == 0:  # some keys held elsewhere: a second result
            held = service.lock(templates[n % 3].format(n=n)).acquire()
            functions[n % 3](n)
            held.release()
        else:
            functions[n % 3](n)
    series = {
        name: set(telemetry.points(name))
        for name in otel_conventions.METRICS
        if telemetry.points(name)
    }
    assert set(series) >= {
        "tasklock.acquire.duration",
        "tasklock.hold.duration",
        "tasklock.active",
        "tasklock.skipped",
    }
    for name, found in series.items():
        assert len(found) <= len(templates) * RESULTS, name
        named = {dict(attributes).get("tasklock.name") for attributes in found}
        assert named <= {*templates, None}, name
    # The acquisitions themselves: 3 templates x (acquired, held_elsewhere), plus the
    # 100 unnamed holders of the held keys.
    assert len(series["tasklock.acquire.duration"]) == 3 * 2 + 1


def test_the_setting_installs_and_removes_the_observer() -> None:
    assert observe.observer is None  # the default
    with override_settings(TASKLOCK_OPENTELEMETRY=True):
        assert isinstance(observe.observer, otel.Telemetry)
    assert observe.observer is None


def test_a_setting_that_is_not_a_bool_names_itself() -> None:
    with (
        pytest.raises(ImproperlyConfigured, match="TASKLOCK_OPENTELEMETRY must be True or False"),
        override_settings(TASKLOCK_OPENTELEMETRY="yes"),
    ):
        pass
    assert observe.observer is None


def test_the_setting_without_the_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        INTEGRATIONS, "otel", Integration("tasklock_no_such_module", "opentelemetry-api", "otel")
    )
    # As if never imported (the extra absent): no module, no attribute of the package.
    monkeypatch.delitem(sys.modules, "django_tasklock.contrib.otel")
    monkeypatch.delattr(contrib, "otel")
    with (
        pytest.raises(MissingFramework, match=r"pip install 'django-tasklock\[otel\]'"),
        override_settings(TASKLOCK_OPENTELEMETRY=True),
    ):
        pass
    assert observe.observer is None


def test_the_core_imports_no_opentelemetry() -> None:
    script = """
import sys
import django
from django.conf import settings
settings.configure(INSTALLED_APPS=["django_tasklock"], TASKLOCK_BACKEND="memory")
django.setup()
import django_tasklock
from django_tasklock import heartbeat, lock, observe, run_exclusive
with lock("k", name="n"):
    pass
run_exclusive("k", lambda: None)
assert observe.observer is None
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_enabled_without_an_sdk_it_stays_idle_until_one_is_set() -> None:
    script = """
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["django_tasklock"], TASKLOCK_BACKEND="memory", TASKLOCK_OPENTELEMETRY=True
)
django.setup()
from django_tasklock import lock, observe
from django_tasklock.contrib.otel import Telemetry
assert isinstance(observe.observer, Telemetry)
with lock("k", name="n"):
    assert not observe.observer.live()  # no SDK: no span, no measurement

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)  # the SDK, configured after Django started
import time
time.sleep(1.1)  # looked for at most once a second
with lock("k", name="n"):
    pass
assert observe.observer.live()
names = [span.name for span in spans.get_finished_spans()]
assert names == ["tasklock.acquire", "tasklock.hold"], names
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
