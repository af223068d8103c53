"""The Redis backend's system checks: a missing package, a bad URL, a cache that is not Redis.

Read from settings and installed packages only: nothing connects to Redis.
"""

from __future__ import annotations

import importlib

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_tasklock.backends.redis.replicas import ack_from_settings
from django_tasklock.backends.redis.urls import FORMS, RedisURLError, parse_url
from django_tasklock.conf import conf

#: The PyPI names of what the Redis backend imports: these install from anywhere.
PACKAGES = {"redis": "redis", "django_redis": "django-redis"}


def check_redis() -> list[checks.CheckMessage]:
    """E002: redis-py (or, without a URL, django-redis) is missing; E009: the URL.

    E003-E004: the cache, when no URL is set. E011: the replica acknowledgement settings.
    """
    needed = ["redis"] if conf.REDIS_URL else ["redis", "django_redis"]
    missing = [PACKAGES[module] for module in needed if not _importable(module)]
    errors: list[checks.CheckMessage] = []
    if missing:
        shown = " and ".join("redis-py" if name == "redis" else name for name in missing)
        errors.append(
            checks.Error(
                f"The Redis lock backend needs {shown}, which cannot be imported.",
                hint=f"pip install {' '.join(missing)} (django-redis lets the lock share a "
                "django-redis cache's connection pool, TASKLOCK_REDIS_CACHE; with "
                "TASKLOCK_REDIS_URL, redis alone is enough).",
                id="django_tasklock.E002",
            )
        )
    try:
        ack_from_settings()  # the same reading as at first use
    except ImproperlyConfigured as exc:
        errors.append(
            checks.Error(
                str(exc),
                hint="TASKLOCK_REDIS_MIN_REPLICAS is a whole number (0: no acknowledgement); "
                "TASKLOCK_REDIS_REPLICA_TIMEOUT is seconds or a timedelta, 1 ms to 24 h.",
                id="django_tasklock.E011",
            )
        )
    if conf.REDIS_URL:
        try:
            # The same reading as at first use, so check and first use agree.
            parse_url(conf.REDIS_URL)
        except RedisURLError as exc:
            errors.append(
                checks.Error(
                    f"{exc.setting}: {exc.problem}.",
                    hint=f"Give TASKLOCK_REDIS_URL one of the forms {FORMS}.",
                    id="django_tasklock.E009",
                )
            )
        return errors
    alias = conf.REDIS_CACHE
    cache = settings.CACHES.get(alias)
    if cache is None:
        errors.append(
            checks.Error(
                f"TASKLOCK_REDIS_CACHE names the cache {alias!r}, which is not in CACHES.",
                hint="Add a django-redis cache under that alias, or set TASKLOCK_REDIS_URL.",
                id="django_tasklock.E003",
            )
        )
    elif not str(cache.get("BACKEND", "")).startswith("django_redis."):
        errors.append(
            checks.Error(
                f"The cache {alias!r} (TASKLOCK_REDIS_CACHE) is not a django-redis cache.",
                hint='Give it BACKEND "django_redis.cache.RedisCache", or set TASKLOCK_REDIS_URL.',
                id="django_tasklock.E004",
            )
        )
    return errors


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
