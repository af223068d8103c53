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
