"""Validating what callers pass, before anything is written.

Every error is a ``TypeError`` or ``ValueError`` whose message names the
parameter, so a mistake is found at the call that made it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, TypedDict

from asgiref.sync import iscoroutinefunction

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


def validate_sync_callable(name: str, value: object, *, twin: str) -> None:
    """A callable that is not a coroutine function (whose coroutine would never run)."""
    validate_callable(name, value)
    if iscoroutinefunction(value):
        raise TypeError(f"{name} is a coroutine function: use {twin}() for async work")


def validate_async_callable(name: str, value: object, *, twin: str) -> None:
    """A coroutine function (``async def``)."""
    validate_callable(name, value)
    if not iscoroutinefunction(value):
        raise TypeError(
            f"{name} must be a coroutine function (async def); use {twin}() for {value!r}"
        )


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
        is reported as ``TASKLOCK_DEFAULTS['name']``.
        """
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


class LockKwargs(TypedDict, total=False):
    """The options every way of taking a lock accepts, declared once.

    ``lock()``, ``run_exclusive()`` and ``arun_exclusive()`` take them as
    keyword arguments (``**options: Unpack[LockKwargs]``):

    ``ttl``, ``refresh_interval``, ``max_lifetime``: the lease's timing (see
    :class:`LockOptions`). ``wait``: how long to keep trying while the key is
    held (seconds or timedelta; default: no waiting). ``min_hold``: after the
    work ends early, the key stays held until acquisition + ``min_hold``, by
    the storage (at most ``max_lifetime``). ``fencing``: give each grant a
    strictly increasing number (``Lock.fence``, ``LockResult.fence``).
    """

    ttl: Duration | None
    refresh_interval: Duration | None
    max_lifetime: Duration | None
    wait: Duration | None
    min_hold: Duration | None
    fencing: bool


LOCK_KWARGS = frozenset(LockKwargs.__annotations__)


def check_lock_kwargs(options: Mapping[str, object]) -> None:
    """A ``TypeError`` naming the first keyword that is not a lock option."""
    unknown = sorted(set(options) - LOCK_KWARGS)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument {unknown[0]!r}; lock options are "
            f"{', '.join(sorted(LOCK_KWARGS))}"
        )


def validate_wait(value: object) -> timedelta:
    """How long to keep trying: None or 0 for not at all, else positive seconds or timedelta."""
    if value is None:
        return timedelta(0)
    if not isinstance(value, bool) and isinstance(value, (int, float, timedelta)):
        if value == 0 or value == timedelta(0):
            return timedelta(0)
        if (value < timedelta(0)) if isinstance(value, timedelta) else (value < 0):
            raise ValueError(f"wait must not be negative, got {value!r}")
    return to_timedelta("wait", value)


def validate_min_hold(value: object, max_lifetime: timedelta) -> timedelta | None:
    """None, or a duration no longer than ``max_lifetime`` (the storage caps every lease)."""
    if value is None:
        return None
    min_hold = to_timedelta("min_hold", value)
    if min_hold > max_lifetime:
        raise ValueError(
            f"min_hold must be at most max_lifetime ({min_hold} > {max_lifetime}): "
            "no lease outlives acquisition + max_lifetime"
        )
    return min_hold


def validate_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value
