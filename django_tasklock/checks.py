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
    from django_tasklock.options import LockOptions

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
        LockOptions.resolve()
        # The defaults must also hold together, as if a caller passed them all.
        LockOptions.resolve(**conf.DEFAULTS, defaults={})
    except (TypeError, ValueError) as exc:
        errors.append(
            checks.Error(
                f"TASKLOCK_DEFAULTS is invalid: {exc}",
                hint="TASKLOCK_DEFAULTS takes ttl, refresh_interval and max_lifetime as "
                "seconds or timedeltas, with refresh_interval < ttl and max_lifetime <= 24 h.",
                id="django_tasklock.E007",
            )
        )
    return errors
