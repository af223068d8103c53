"""Validating what callers pass, before anything is written.

Every error is a ``TypeError`` or ``ValueError`` whose message names the
parameter, so a mistake is found at the call that made it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.core.signals import setting_changed

from django_tasklock.backends.base import KEY_PREFIX, STALE_AFTER
from django_tasklock.conf import conf

Duration = int | float | timedelta

#: 255 (the column) minus the ``task-lock:`` prefix, on every backend.
MAX_KEY_LENGTH = 255 - len(KEY_PREFIX)
MAX_LIFETIME_LIMIT = STALE_AFTER
DEFAULT_TTL = timedelta(minutes=15)
OPTION_NAMES = ("ttl", "refresh_interval", "max_lifetime")


def validate_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError("key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"key must be at most {MAX_KEY_LENGTH} characters, got {len(key)}")
    return key


def validate_callable(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not callable(value):
        raise TypeError(f"{name} must be callable, not {type(value).__name__}")


def to_timedelta(name: str, value: object) -> timedelta:
    """Seconds (int or float) or a timedelta, strictly positive and finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, not {value!r}")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


@dataclasses.dataclass(frozen=True)
class LockOptions:
    """The lease's timing, validated: ``0 < refresh_interval < ttl``, ``max_lifetime <= 24 h``."""

    ttl: timedelta = DEFAULT_TTL
    refresh_interval: timedelta = DEFAULT_TTL / 3
    max_lifetime: timedelta = MAX_LIFETIME_LIMIT

    @classmethod
    def resolve(
        cls,
        *,
        ttl: Duration | None = None,
        refresh_interval: Duration | None = None,
        max_lifetime: Duration | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> LockOptions:
        """Combine the call's options with ``TASKLOCK_DEFAULTS`` (or ``defaults``).

        ``refresh_interval`` defaults to a third of the ttl unless the settings
        name one shorter than the ttl. A value from settings that is invalid
        is reported as ``TASKLOCK_DEFAULTS['name']``. Results from the settings
        are remembered per argument values (and types, so ``True`` is never
        taken for ``1``) until ``TASKLOCK_DEFAULTS`` changes.
        """
        if defaults is not None:
            return cls._resolve(ttl, refresh_interval, max_lifetime, defaults)
        args = (ttl, refresh_interval, max_lifetime)
        cache_key = (args, tuple(map(type, args)))
        try:
            return _resolved[cache_key]
        except KeyError:
            pass
        except TypeError:  # an unhashable argument: the checks below name it
            return cls._resolve(ttl, refresh_interval, max_lifetime, None)
        options = cls._resolve(ttl, refresh_interval, max_lifetime, None)
        if len(_resolved) >= _RESOLVED_MAX:  # callers with ever-new values: do not grow
            _resolved.clear()
        _resolved[cache_key] = options
        return options

    @classmethod
    def _resolve(
        cls,
        ttl: Duration | None,
        refresh_interval: Duration | None,
        max_lifetime: Duration | None,
        defaults: Mapping[str, Any] | None,
    ) -> LockOptions:
        project = conf.DEFAULTS if defaults is None else dict(defaults)
        unknown = set(project) - set(OPTION_NAMES)
        if unknown:
            raise ValueError(
                f"TASKLOCK_DEFAULTS has unknown keys {sorted(unknown)}; allowed: {OPTION_NAMES}"
            )

        def pick(name: str, value: object) -> timedelta | None:
            if value is not None:
                return to_timedelta(name, value)
            if project.get(name) is not None:
                return to_timedelta(f"TASKLOCK_DEFAULTS[{name!r}]", project[name])
            return None

        ttl_td = pick("ttl", ttl) or DEFAULT_TTL
        interval_td = pick("refresh_interval", refresh_interval)
        if interval_td is None or (refresh_interval is None and interval_td >= ttl_td):
            # A project-wide interval too long for this call's ttl gives way.
            interval_td = ttl_td / 3
        lifetime_td = pick("max_lifetime", max_lifetime) or MAX_LIFETIME_LIMIT
        if interval_td >= ttl_td:
            raise ValueError(
                f"refresh_interval must be less than ttl ({interval_td} >= {ttl_td}): "
                "the lease would expire between two refreshes"
            )
        if lifetime_td > MAX_LIFETIME_LIMIT:
            raise ValueError(f"max_lifetime must be at most 24 hours, got {lifetime_td}")
        return cls(ttl=ttl_td, refresh_interval=interval_td, max_lifetime=lifetime_td)


# LockOptions.resolve's answers from the settings; see forget_resolved().
_resolved: dict[tuple[tuple[object, ...], tuple[type, ...]], LockOptions] = {}
_RESOLVED_MAX = 256


def _forget_resolved(*, setting: str, **kwargs: Any) -> None:
    """Drop remembered options when ``TASKLOCK_DEFAULTS`` changes (``override_settings``)."""
    if setting == "TASKLOCK_DEFAULTS":
        _resolved.clear()


# Connected here, not in the app's ready(): the cache exists without the app too.
setting_changed.connect(_forget_resolved, dispatch_uid="django_tasklock.options")
