"""Making the Redis backend's connection: from a URL, or a django-redis cache's.

Run on first use (see ``RedisBackend._conn``), never at import: redis-py and
django-redis are imported here, inside :func:`connect`, so that the package
imports without them and ``manage.py check`` can say what is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.cache import InvalidCacheBackendError
from django.core.exceptions import ImproperlyConfigured

from django_tasklock.backends.redis.urls import client_from_url

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster


def connect(url: str | None, cache_alias: str | None) -> redis.Redis | RedisCluster:
    """A client for ``url`` if given, else the django-redis connection of ``cache_alias``.

    ``ImproperlyConfigured`` saying what to install or set when redis-py
    (or, for a cache alias, django-redis) is missing or the alias is no
    django-redis cache.
    """
    try:
        import redis  # noqa: F401 - the check that redis-py is installed
    except ImportError as exc:
        raise ImproperlyConfigured(
            "The Redis lock backend needs redis-py: pip install redis."
        ) from exc
    if url is not None:
        return client_from_url(url)
    try:
        from django_redis import get_redis_connection
    except ImportError as exc:
        raise ImproperlyConfigured(
            "TASKLOCK_REDIS_CACHE needs django-redis: pip install django-redis "
            "(or set TASKLOCK_REDIS_URL, which needs only redis)."
        ) from exc
    try:
        connection: redis.Redis = get_redis_connection(cache_alias, write=True)
    except (InvalidCacheBackendError, NotImplementedError) as exc:
        raise ImproperlyConfigured(
            f"TASKLOCK_REDIS_CACHE={cache_alias!r} must name a django-redis cache "
            "in CACHES (or set TASKLOCK_REDIS_URL)."
        ) from exc
    return connection
