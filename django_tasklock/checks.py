"""System checks: a misconfiguration is reported by ``manage.py check``, never at import.

Registered by the app's ``AppConfig.ready()``.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_tasklock.conf import conf


def check_tasklock_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django_tasklock.backends import BUILTIN_BACKENDS, backend_class
    from django_tasklock.options import project_defaults

    errors: list[checks.CheckMessage] = []
    try:
        cls = backend_class(conf.BACKEND)
    except ImproperlyConfigured as exc:
        errors.append(
            checks.Error(
                str(exc),
                hint=(
                    f"Set TASKLOCK_BACKEND (or the TASKLOCK_BACKEND environment variable) to "
                    f"one of {', '.join(map(repr, BUILTIN_BACKENDS))} or to the dotted path "
                    "of a BaseBackend subclass."
                ),
                id="django_tasklock.E001",
            )
        )
    else:
        errors.extend(cls.check())
    try:
        # The same validation as at run time, so check and run time agree.
        project_defaults()
    except ImproperlyConfigured as exc:
        errors.append(
            checks.Error(
                f"TASKLOCK_DEFAULTS is invalid: {exc}",
                hint="TASKLOCK_DEFAULTS takes ttl, refresh_interval and max_lifetime as "
                "seconds or timedeltas from 1 ms to 24 h, with refresh_interval < ttl "
                "(the built-in ttl, 15 minutes, when it names none) and ttl <= max_lifetime "
                "when it names both.",
                id="django_tasklock.E007",
            )
        )
    return errors


def check_health_setting(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django_tasklock.health import limits

    try:
        limits()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="TASKLOCK_HEALTH maps key patterns ('*' or a template's {field} matches "
                "any characters) to a max_held duration, or to a dict of max_held, ttl, "
                "refresh_interval and max_lifetime, each seconds or a timedelta.",
                id="django_tasklock.E010",
            )
        ]
    return []


_HINTS = {
    "held_too_long": (
        "django_tasklock.W010",
        "manage.py tasklock list shows its holder (host and pid); if it may run this "
        "long, raise max_held in TASKLOCK_HEALTH.",
    ),
    "refresh_overdue": (
        "django_tasklock.W011",
        "Its holder's refreshes are late or stopped (a slow or blocked storage, a paused "
        "process): manage.py tasklock list shows the holder. If its lock uses another ttl "
        "or refresh_interval, give them in its TASKLOCK_HEALTH entry.",
    ),
    "heartbeat_behind": (
        "django_tasklock.W012",
        "This process's refreshes wait on the lock storage: look for a slow or blocked "
        "database (a row lock) or Redis.",
    ),
}


def check_lock_health(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Deploy check (tag ``tasklock``): locks held too long, heartbeats behind.

    Reads the storage only when ``TASKLOCK_HEALTH`` names patterns; a storage
    that cannot be read is a warning (``W013``), not an error.
    """
    from django_tasklock.health import heartbeat_findings, lease_findings, limits
    from django_tasklock.service import TaskLockService

    found = heartbeat_findings()
    messages: list[checks.CheckMessage] = []
    try:
        entries = limits()
    except ImproperlyConfigured:
        entries = []  # reported as E010 by check_health_setting
    if entries:
        try:
            found += lease_findings(TaskLockService().backend.list(), entries)
        except Exception as exc:
            messages.append(
                checks.Warning(
                    f"Could not list the task locks to check their health: "
                    f"{type(exc).__name__}: {exc}",
                    hint="Is the lock storage (TASKLOCK_BACKEND) reachable from here?",
                    id="django_tasklock.W013",
                )
            )
    warnings: list[checks.CheckMessage] = []
    for finding in found:
        check_id, hint = _HINTS[finding.kind]
        warnings.append(checks.Warning(finding.describe(), hint=hint, id=check_id))
    return warnings + messages
