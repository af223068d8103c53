"""Settings, read at call time so that ``override_settings`` works in tests.

Anything cached from these (the chosen backend) is dropped on Django's
``setting_changed`` signal; see ``apps.py``.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

BACKEND_ENV_VAR = "TASKLOCK_BACKEND"
REDIS_URL_ENV_VAR = "TASKLOCK_REDIS_URL"


class Settings:
    @property
    def BACKEND(self) -> str:
        """``TASKLOCK_BACKEND``; when absent, the environment variable; else "database"."""
        value = getattr(settings, "TASKLOCK_BACKEND", None)
        if value is None:
            value = os.environ.get(BACKEND_ENV_VAR) or "database"
        return str(value)

    @property
    def DATABASE(self) -> str:
        return str(getattr(settings, "TASKLOCK_DATABASE", "default"))

    @property
    def REDIS_CACHE(self) -> str:
        return str(getattr(settings, "TASKLOCK_REDIS_CACHE", "default"))

    @property
    def REDIS_URL(self) -> str | None:
        """``TASKLOCK_REDIS_URL``; when absent, the environment variable; else None.

        Read like ``BACKEND``, so that the two environment variables alone
        switch any project to Redis.
        """
        value = getattr(settings, "TASKLOCK_REDIS_URL", None)
        if value is None:
            value = os.environ.get(REDIS_URL_ENV_VAR)
        return str(value) if value else None

    @property
    def OPENTELEMETRY(self) -> bool:
        """``TASKLOCK_OPENTELEMETRY``: trace and measure every lock (the ``otel`` extra)."""
        value = getattr(settings, "TASKLOCK_OPENTELEMETRY", False)
        if not isinstance(value, bool):
            raise ImproperlyConfigured(
                f"TASKLOCK_OPENTELEMETRY must be True or False, not {value!r}"
            )
        return value

    @property
    def REDIS_MIN_REPLICAS(self) -> object:
        """``TASKLOCK_REDIS_MIN_REPLICAS``, unchecked (see ``backends.redis.replicas``)."""
        return getattr(settings, "TASKLOCK_REDIS_MIN_REPLICAS", 0)

    @property
    def REDIS_REPLICA_TIMEOUT(self) -> object:
        """``TASKLOCK_REDIS_REPLICA_TIMEOUT``, unchecked: seconds or a timedelta, default 1 s."""
        return getattr(settings, "TASKLOCK_REDIS_REPLICA_TIMEOUT", 1)

    @property
    def DEFAULTS(self) -> dict[str, Any]:
        return dict(getattr(settings, "TASKLOCK_DEFAULTS", None) or {})

    @property
    def HEALTH(self) -> Any:
        """``TASKLOCK_HEALTH`` as given (validated by ``health.limits()``); None when absent."""
        return getattr(settings, "TASKLOCK_HEALTH", None)


conf = Settings()
