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

from django_tasklock import Lock, TaskLockService, contrib, current_lock, exclusive
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.contrib import (
    INTEGRATIONS,
    Integration,
    MissingFramework,
    otel,
)
from django_tasklock.leases import observe
from tests.support.otel_support import Telemetry, eventually, observed

ROOT = Path(__file__).resolve().parents[2]
#: The values tasklock.result takes.
RESULTS = 4


def current_name() -> str | None:
    lock = current_lock()
    assert lock is not None
    return lock.name


def current_key() -> str:
    lock = current_lock()
    assert lock is not None
    return lock.key


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
    """Every outcome among them (acquired, held elsewhere, a wait that times out, a
    loss) and every metric: each metric's series are bounded by the templates (and
    the backend), however many keys."""
    backend = MemoryBackend()
    service = TaskLockService(backend)
    templates = ("invoice:{n}", "report:{n}", "mail:{n}")

    def lose(n: int) -> Lock:
        """A body whose lock is lost: an operator releases it, another holder takes the
        key, and the release at the end finds it taken."""
        key = current_key()
        backend.force_release(key)
        return service.lock(key).acquire()

    runs = [exclusive(template, service=service)(work) for template in templates]
    waits = [exclusive(template, service=service, wait=0.1)(work) for template in templates]
    losses = [exclusive(template, service=service)(lose) for template in templates]
    # Ticking all along (unnamed): the heartbeat's series.
    with service.lock("cardinality-beat", ttl=5, refresh_interval=0.05):
        for n in range(10_000):
            template = templates[n % 3]
            if n % 100 == 0:  # held elsewhere: not run
                with service.lock(template.format(n=n)):
                    assert runs[n % 3](n) is None
            elif n % 1000 == 1:  # held elsewhere all through a wait: not run either
                with service.lock(template.format(n=n)):
                    assert waits[n % 3](n) is None
            elif n % 1000 == 2:
                taker = losses[n % 3](n)
                assert taker is not None
                taker.release()
            else:
                assert runs[n % 3](n) == n
        eventually(lambda: bool(telemetry.points("tasklock.heartbeat.duration")))
    series = {name: set(telemetry.points(name)) for name in telemetry.metrics()}
    for name, found in series.items():
        assert len(found) <= len(templates) * RESULTS, name
        named = {dict(attributes).get("tasklock.name") for attributes in found}
        assert named <= {*templates, None}, name
    # Per template: acquired, held_elsewhere, timeout; plus the unnamed locks (the
    # holders of the held keys, the takers, the ticking one), all acquired.
    assert {name: len(found) for name, found in series.items()} == {
        "tasklock.acquire.duration": 3 * 3 + 1,
        "tasklock.hold.duration": 3 + 1,
        "tasklock.active": 3 + 1,
        "tasklock.waiting": 3,
        "tasklock.lost": 3,  # one reason: taken
        "tasklock.skipped": 3,  # held elsewhere, and timed out
        "tasklock.heartbeat.duration": 1,  # by backend only
        "tasklock.heartbeat.leases": 1,
    }
    reasons = {dict(attributes)["tasklock.lost.reason"] for attributes in series["tasklock.lost"]}
    assert reasons == {"taken"}


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


def test_the_setting_without_the_extra_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        INTEGRATIONS,
        "otel",
        Integration("tasklock_no_such_module", "opentelemetry-api", "otel", versions=">=1.30"),
    )
    # As if never imported (the extra absent): no module, no attribute of the package.
    monkeypatch.delitem(sys.modules, "django_tasklock.contrib.otel")
    monkeypatch.delattr(contrib, "otel")
    with (
        pytest.raises(MissingFramework, match=r"pip install 'opentelemetry-api>=1\.30'"),
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
from django_tasklock import lock, run_exclusive
from django_tasklock.leases import heartbeat, observe
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
from django_tasklock import lock
from django_tasklock.leases import observe
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
