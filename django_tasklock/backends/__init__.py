"""Choosing the backend named by ``TASKLOCK_BACKEND``, lazily, once per settings."""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_tasklock.backends.base import BaseBackend
from django_tasklock.conf import conf

BUILTIN_BACKENDS = {
    "database": "django_tasklock.backends.database.DatabaseBackend",
    "postgres": "django_tasklock.backends.database.PostgresBackend",
    "redis": "django_tasklock.backends.redis.RedisBackend",
    "memory": "django_tasklock.backends.memory.MemoryBackend",
}

_lock = threading.Lock()
_backend: BaseBackend | None = None


def backend_class(name: str) -> type[BaseBackend]:
    """The backend class for a short name or a dotted path.

    Raises ``ImproperlyConfigured`` when the name is unknown, the path does not
    import, or the class is not a ``BaseBackend``.
    """
    path = BUILTIN_BACKENDS.get(name, name)
    if "." not in path:
        raise ImproperlyConfigured(
            f"TASKLOCK_BACKEND = {name!r} is not a known backend: use one of "
            f"{', '.join(map(repr, BUILTIN_BACKENDS))} or a dotted path to a backend class."
        )
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"TASKLOCK_BACKEND = {name!r} could not be imported: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseBackend)):
        raise ImproperlyConfigured(
            f"TASKLOCK_BACKEND = {name!r} is not a subclass of "
            "django_tasklock.backends.base.BaseBackend."
        )
    return cls


def get_backend() -> BaseBackend:
    """The backend the settings choose, built on first use and then reused."""
    global _backend
    backend = _backend
    if backend is None:
        with _lock:
            if _backend is None:
                _backend = backend_class(conf.BACKEND).from_settings()
            backend = _backend
    return backend


def reset_backend() -> None:
    """Forget the cached backend (settings changed)."""
    global _backend
    with _lock:
        _backend = None
