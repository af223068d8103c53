"""A task of Django's Tasks framework (``django.tasks``, or the django-tasks backport)."""

from __future__ import annotations

from django_tasklock import exclusive
from tests.jobs import hold

try:  # Django >= 6.0
    from django.tasks import task
except ImportError:  # the backport
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@task()
@exclusive("django-task:{key}", ttl=60)
def hold_key(key: str, job: str, signals: str) -> str | None:
    """Hold ``django-task:key`` until the test releases ``job``."""
    return hold(job, signals)
