"""A django-health-check check: task locks held too long, heartbeats behind.

Install django-health-check 4 (``pip install 'django-health-check>=4.0'``, what the
``health-check`` extra installs; it needs Django 5.2 or later) and name the check in
the view's ``checks``::

    path("ht/", HealthCheckView.as_view(checks=[
        "health_check.checks.Database",
        "django_tasklock.contrib.health_check.TaskLocks",
    ]))

It reports what :mod:`django_tasklock.ops.health` finds: this process's
heartbeat, and (when ``TASKLOCK_HEALTH`` names patterns) each listed lease of
the backend ``TASKLOCK_BACKEND`` chooses. A finding is a ``ServiceWarning``; a
storage that cannot be read, one whose refreshes by this process's heartbeat
fail, or an invalid ``TASKLOCK_HEALTH``, is ``ServiceUnavailable``. Messages
name the ``TASKLOCK_HEALTH`` pattern, not the key (health pages are often
public), unless ``show_keys=True``. The permits of a ``limit=N`` key are
judged by its key's pattern, each a lease of its own; those of one key found
so make one finding (``health.merged``): one key, not N locks.
"""

from __future__ import annotations

import dataclasses

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from django_tasklock.contrib import MissingFramework, require

require("health_check")

try:
    from health_check.base import HealthCheck
    from health_check.exceptions import ServiceUnavailable, ServiceWarning
except ImportError as exc:  # django-health-check 3: another plugin API
    raise MissingFramework(
        "django_tasklock.contrib.health_check needs django-health-check 4 or later (which "
        "needs Django 5.2 or later): pip install 'django-health-check>=4.0'",
        name="health_check",
    ) from exc

from django_tasklock.api.service import TaskLockService  # noqa: E402
from django_tasklock.ops import health  # noqa: E402 - after the framework is known to be there

#: Findings named in one message; the rest are counted.
SHOWN = 5


@dataclasses.dataclass
class TaskLocks(HealthCheck):  # type: ignore[misc] # django-health-check is untyped
    """Task locks held longer than ``TASKLOCK_HEALTH`` allows, or not refreshed on time."""

    show_keys: bool = False  #: name each lease's key (else its TASKLOCK_HEALTH pattern)

    async def run(self) -> None:
        # On a thread of its own: the database backend's connection is closed after.
        found = await sync_to_async(_look, thread_sensitive=False)()
        down = [f for f in found if f.kind == health.STORAGE_UNREACHABLE]
        if down:  # this process's locks cannot be kept: not merely a warning
            raise ServiceUnavailable(down[0].describe())
        if found:
            lines = list(dict.fromkeys(f.describe(key=self.show_keys) for f in found))
            more = len(lines) - SHOWN
            raise ServiceWarning(
                " ".join(lines[:SHOWN]) + (f" ({more} more.)" if more > 0 else "")
            )


def _look() -> list[health.Finding]:
    found = health.heartbeat_findings()
    try:
        entries = health.limits()
    except ImproperlyConfigured as exc:
        raise ServiceUnavailable(str(exc)) from exc
    if not entries:
        return found
    backend = TaskLockService().backend
    try:
        return found + health.merged(health.lease_findings(backend.list(), entries))
    except Exception as exc:
        # Not the error's text: it may name hosts or credentials.
        raise ServiceUnavailable(f"Could not list the task locks ({type(exc).__name__}).") from exc
    finally:
        backend.close()
