"""Integrations with task frameworks, each needing its framework, none imported by the core.

Each ``django_tasklock.contrib.<integration>`` module starts with
``require("<integration>")``: imported without its framework installed, it raises
:class:`MissingFramework` (an ``ImportError``) naming what to install. ``manage.py
check`` says the same (``django_tasklock.E020``) for every integration a setting names
by its dotted path (``DJANGO_CRON_LOCK_BACKEND``, a scheduler class, a middleware list,
``INSTALLED_APPS``...), so a deploy check catches it before a worker starts.

Most are installed with an extra of django-tasklock's. Two are not: the
framework is one the project already runs and has installed itself, and an
extra could not pick the right version (``celery.database``: django-celery-beat,
which does not support Django 6.1 yet, so an extra would make pip move Django
back to 6.0; ``django_tasks``: built into Django from 6.0, the django-tasks
backport before).

Nothing in the core imports a task framework.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Integration:
    module: str  # the framework's top-level module, looked for without importing it
    distribution: str  # what pip installs
    extra: str | None = None  # django-tasklock's extra that installs it; None: there is none
    also: tuple[str, ...] = ()  # other modules that provide the framework as well
    note: str = ""  # said after the distribution's name, in parentheses
    #: The versions the extra asks for (pyproject.toml), e.g. ">=2.5".
    versions: str = ""

    @property
    def install(self) -> str:
        """The command that installs it, as it works when pasted: the framework's own
        package from PyPI (django-tasklock itself is installed from a clone, and its
        extra only adds this package)."""
        if not self.versions:
            return f"pip install {self.distribution}"
        return f"pip install '{self.distribution}{self.versions}'"


#: ``django_tasklock.contrib.<name>`` -> what it needs. Static, so that the check can
#: tell what is missing without importing the integration (which would fail).
INTEGRATIONS: dict[str, Integration] = {
    "apscheduler": Integration("apscheduler", "APScheduler", "apscheduler", versions=">=3.10,<4"),
    "celery": Integration("celery", "celery", "celery", versions=">=5.3"),
    "celery.database": Integration("django_celery_beat", "django-celery-beat"),
    "django_cron": Integration(
        "django_cron", "django-cron-django5", "django-cron", versions=">=0.6.3"
    ),
    "django_tasks": Integration(
        "django.tasks",
        "django-tasks",
        also=("django_tasks",),
        note="the backport of django.tasks, which Django has from 6.0",
    ),
    "dramatiq": Integration("dramatiq", "dramatiq", "dramatiq", versions=">=1.17"),
    "health_check": Integration(
        "health_check", "django-health-check", "health-check", versions=">=4.0"
    ),
    "huey": Integration("huey", "huey", "huey", versions=">=2.5"),
    "otel": Integration("opentelemetry", "opentelemetry-api", "otel", versions=">=1.30"),
    "rq": Integration("rq", "rq", "rq", versions=">=2.0"),
}

#: Names a package re-exports from an integration of its own (``__getattr__``):
#: ``contrib.<alias>`` needs ``contrib.<integration>``.
ALIASES: dict[str, str] = {"celery.LeaderDatabaseScheduler": "celery.database"}


class MissingFramework(ImportError):
    """An integration was imported (or named in settings) without its framework."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or broken
        return False


def missing_message(name: str) -> str | None:
    """Why ``django_tasklock.contrib.<name>`` cannot work here, or None when it can."""
    integration = INTEGRATIONS[name]
    if any(_installed(module) for module in (integration.module, *integration.also)):
        return None
    needs = integration.distribution
    if integration.note:
        needs = f"{needs} ({integration.note})"
    return (
        f"django_tasklock.contrib.{name} needs {needs}, which is not installed: "
        f"{integration.install}"
    )


def require(name: str) -> None:
    """Raise :class:`MissingFramework` unless ``contrib.<name>``'s framework is installed."""
    message = missing_message(name)
    if message is not None:
        raise MissingFramework(message, name=INTEGRATIONS[name].module)
