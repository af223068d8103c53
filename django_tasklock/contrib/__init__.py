"""Integrations with task frameworks, each behind an optional extra.

Each ``django_tasklock.contrib.<integration>`` module starts with
``require("<integration>")``: imported without its framework installed, it raises
:class:`MissingFramework` (an ``ImportError``) naming the extra to install. ``manage.py
check`` says the same (``django_tasklock.E020``) for every integration a setting names
by its dotted path (``DJANGO_CRON_LOCK_BACKEND``, a scheduler class, a middleware list,
``INSTALLED_APPS``...), so a deploy check catches it before a worker starts.

Nothing in the core imports a task framework.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Integration:
    module: str  # the framework's top-level module, looked for without importing it
    distribution: str  # what pip installs
    extra: str  # django-tasklock's optional extra that installs it


#: ``django_tasklock.contrib.<name>`` -> what it needs. Static, so that the check can
#: tell what is missing without importing the integration (which would fail).
INTEGRATIONS: dict[str, Integration] = {
    "apscheduler": Integration("apscheduler", "APScheduler", "apscheduler"),
    "celery": Integration("celery", "celery", "celery"),
    "django_cron": Integration("django_cron", "django-cron", "django-cron"),
    "django_q": Integration("django_q", "django-q2", "django-q2"),
    "dramatiq": Integration("dramatiq", "dramatiq", "dramatiq"),
    "health_check": Integration("health_check", "django-health-check", "health-check"),
    "huey": Integration("huey", "huey", "huey"),
    "otel": Integration("opentelemetry", "opentelemetry-api", "otel"),
    "rq": Integration("rq", "rq", "rq"),
}


class MissingFramework(ImportError):
    """An integration was imported (or named in settings) without its framework."""


def missing_message(name: str) -> str | None:
    """Why ``django_tasklock.contrib.<name>`` cannot work here, or None when it can."""
    integration = INTEGRATIONS[name]
    if importlib.util.find_spec(integration.module) is not None:
        return None
    return (
        f"django_tasklock.contrib.{name} needs {integration.distribution}, which is not "
        f"installed: pip install 'django-tasklock[{integration.extra}]'"
    )


def require(name: str) -> None:
    """Raise :class:`MissingFramework` unless ``contrib.<name>``'s framework is installed."""
    message = missing_message(name)
    if message is not None:
        raise MissingFramework(message, name=INTEGRATIONS[name].module)
