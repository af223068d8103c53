"""Tasks of Django's Tasks framework with ``@unique_on``, for test_unique_django_tasks.py.

Each run appends its pid to ``<signals>/<name>.runs``; the holding tasks then
wait for the test's ``<name>.release`` file (see ``tests.jobs.hold``).
"""

from __future__ import annotations

from django_tasklock.contrib.django_tasks import unique_on
from tests.jobs import hold, ran

try:  # Django >= 6.0
    from django.tasks import task
except ImportError:  # the backport
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@unique_on("unique:{name}", ttl=60)
@task()
def hold_unique(name: str, signals: str) -> str:
    ran(name, signals)
    return hold(name, signals)


@unique_on("unique:{name}", ttl=3)
@task()
def hold_briefly_keyed(name: str, signals: str) -> str:
    """``ttl=3``: killed, its worker frees the key within 3 s."""
    ran(name, signals)
    return hold(name, signals)


@unique_on("unique:{name}", ttl=60)
@task()
def fail_unique(name: str, signals: str) -> None:
    ran(name, signals)
    raise ValueError(f"{name} fails")
