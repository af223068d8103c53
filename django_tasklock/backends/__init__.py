"""Choosing the provider named by ``TASKLOCK_BACKEND``, lazily, once per settings."""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_tasklock.backends.base import BaseProvider
from django_tasklock.conf import conf

BUILTIN_BACKENDS = {
    "database": "django_tasklock.backends.database.DatabaseProvider",
    "postgres": "django_tasklock.backends.database.DatabaseProvider",
    "redis": "django_tasklock.backends.redis.RedisProvider",
    "memory": "django_tasklock.backends.memory.MemoryProvider",
}

_lock = threading.Lock()
_provider: BaseProvider | None = None


def provider_class(name: str) -> type[BaseProvider]:
    """The provider class for a short name or a dotted path.

    Raises ``ImproperlyConfigured`` when the name is unknown, the path does not
    import, or the class is not a ``BaseProvider``.
    """
    path = BUILTIN_BACKENDS.get(name, name)
    if "." not in path:
        raise ImproperlyConfigured(
            f"TASKLOCK_BACKEND = {name!r} is not a known backend: use one of "
            f"{', '.join(map(repr, BUILTIN_BACKENDS))} or a dotted path to a provider class."
        )
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"TASKLOCK_BACKEND = {name!r} could not be imported: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseProvider)):
        raise ImproperlyConfigured(
            f"TASKLOCK_BACKEND = {name!r} is not a subclass of "
            "django_tasklock.backends.base.BaseProvider."
        )
    return cls


def get_provider() -> BaseProvider:
    """The provider the settings choose, built on first use and then reused."""
    global _provider
    provider = _provider
    if provider is None:
        with _lock:
            if _provider is None:
                _provider = provider_class(conf.BACKEND).from_settings()
            provider = _provider
    return provider


def reset_provider() -> None:
    """Forget the cached provider (settings changed)."""
    global _provider
    with _lock:
        _provider = None
