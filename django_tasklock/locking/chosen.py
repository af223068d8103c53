"""A lock's options, validated once per distinct set of values the callers pass.

A loop that takes the same lock with the same options (``run_exclusive(key,
fn, ttl=60)`` every minute, a task under ``@exclusive``) asks the same
questions of every call: which options, whether each is valid, how they
combine with ``TASKLOCK_DEFAULTS``. Their answers are remembered here per
option values and types (so ``True`` is never taken for ``1``), until
``TASKLOCK_DEFAULTS`` changes (``setting_changed``). Invalid options are never
remembered: each call raises the same error, naming the parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, NamedTuple

from django.core.signals import setting_changed

from django_tasklock.locking.options import (
    LockOptions,
    validate_flag,
    validate_limit,
    validate_min_hold,
    validate_name,
    validate_progress_timeout,
    validate_wait,
)


class Chosen(NamedTuple):
    """Every option of one lock, validated (see ``LockKwargs``)."""

    name: str | None
    options: LockOptions
    wait: timedelta
    min_hold: timedelta | None
    fencing: bool
    cancel_on_loss: bool
    progress_timeout: timedelta | None
    limit: int


def remembered(options: Mapping[str, Any]) -> Chosen | None:
    """The options chosen before with these very values, or None (never seen, unhashable)."""
    try:
        return _chosen.get((tuple(options.items()), tuple(map(type, options.values()))))
    except TypeError:  # an unhashable value: validated each time
        return None


def choose(options: Mapping[str, Any]) -> Chosen:
    """Validate ``options`` (known names only, see ``check_lock_kwargs``) and remember them.

    Raises ``TypeError`` or ``ValueError`` naming the parameter, or
    ``ImproperlyConfigured`` for invalid ``TASKLOCK_DEFAULTS``.
    """
    name = validate_name(options.get("name"))
    lock_options = LockOptions.resolve(
        ttl=options.get("ttl"),
        refresh_interval=options.get("refresh_interval"),
        max_lifetime=options.get("max_lifetime"),
    )
    chosen = Chosen(
        name=name,
        options=lock_options,
        wait=validate_wait(options.get("wait")),
        min_hold=validate_min_hold(options.get("min_hold"), lock_options.max_lifetime),
        fencing=validate_flag("fencing", options.get("fencing", False)),
        cancel_on_loss=validate_flag("cancel_on_loss", options.get("cancel_on_loss", False)),
        progress_timeout=validate_progress_timeout(options.get("progress_timeout")),
        limit=validate_limit(options.get("limit", 1)),
    )
    try:
        cache_key = (tuple(options.items()), tuple(map(type, options.values())))
        hash(cache_key)
    except TypeError:
        return chosen
    if len(_chosen) >= _CHOSEN_MAX:  # callers with ever-new values: do not grow
        _chosen.clear()
    _chosen[cache_key] = chosen
    return chosen


_chosen: dict[tuple[tuple[tuple[str, Any], ...], tuple[type, ...]], Chosen] = {}
_CHOSEN_MAX = 256


def _forget(*, setting: str, **kwargs: Any) -> None:
    """Drop what was remembered when ``TASKLOCK_DEFAULTS`` changes (``override_settings``)."""
    if setting == "TASKLOCK_DEFAULTS":
        _chosen.clear()


setting_changed.connect(_forget, dispatch_uid="django_tasklock.chosen")
