"""Validating what callers pass, before anything is written (functions: see ``callables``).

A duration alone (seconds or a timedelta, from 1 ms to 24 h) is read by
``durations``; this module holds the options that combine them (``LockOptions``,
``TASKLOCK_DEFAULTS``) and the other lock options (key, wait, flags).

Every error is a ``TypeError`` or ``ValueError`` whose message names the
parameter, so a mistake is found at the call that made it. Invalid
``TASKLOCK_DEFAULTS`` is ``ImproperlyConfigured`` naming the setting, by the
same rules at ``manage.py check`` and at run time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, TypedDict

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from django_tasklock.backends.base import (
    KEY_PREFIX,
    PERMIT_SEPARATOR,
    STALE_AFTER,
    check_limited_key,
)
from django_tasklock.conf import conf
from django_tasklock.durations import MAX_DURATION as MAX_DURATION
from django_tasklock.durations import MIN_DURATION as MIN_DURATION
from django_tasklock.durations import Duration as Duration
from django_tasklock.durations import to_timedelta as to_timedelta

#: 255 (the column) minus the ``task-lock:`` prefix, on every backend.
MAX_KEY_LENGTH = 255 - len(KEY_PREFIX)
MAX_NAME_LENGTH = 255
MAX_LIFETIME_LIMIT = STALE_AFTER
DEFAULT_TTL = timedelta(minutes=15)
OPTION_NAMES = ("ttl", "refresh_interval", "max_lifetime")
#: The largest ``limit``: a lost reply to a permit's request is undone by one
#: release per permit (see ``leases.releasing.discard_permit``), so their number stays small.
MAX_LIMIT = 100


def validate_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError("key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"key must be at most {MAX_KEY_LENGTH} characters, got {len(key)}")
    if "\x00" in key:
        # PostgreSQL refuses NUL in text; Redis would store it. Same answer everywhere.
        raise ValueError("key must not contain NUL ('\\x00')")
    if PERMIT_SEPARATOR in key:
        # It names a limited key's permits in the storage: no key may name one.
        raise ValueError("key must not contain the unit separator ('\\x1f')")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("key must be valid Unicode text (it contains a lone surrogate)") from None
    return key


def project_defaults(settings_value: Mapping[str, Any] | None = None) -> dict[str, timedelta]:
    """``TASKLOCK_DEFAULTS`` validated as a whole, or ``ImproperlyConfigured`` naming it.

    The defaults must hold together as if a caller passed them all (with the
    built-in default for any that is absent): ``refresh_interval < ttl``,
    each duration from 1 ms to 24 h. ``manage.py check`` reports the same
    message as ``django_tasklock.E007``.
    """
    try:
        project = dict(conf.DEFAULTS if settings_value is None else settings_value)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(
            f"TASKLOCK_DEFAULTS must be a dict of ttl, refresh_interval, max_lifetime ({exc})"
        ) from exc
    unknown = sorted(set(project) - set(OPTION_NAMES), key=repr)
    if unknown:
        raise ImproperlyConfigured(
            f"TASKLOCK_DEFAULTS has unknown keys {unknown}; allowed: {OPTION_NAMES}"
        )
    resolved: dict[str, timedelta] = {}
    try:
        for name in OPTION_NAMES:
            if project.get(name) is not None:
                resolved[name] = to_timedelta(f"TASKLOCK_DEFAULTS[{name!r}]", project[name])
        if "refresh_interval" in resolved:
            ttl = resolved.get("ttl", DEFAULT_TTL)
            if resolved["refresh_interval"] >= ttl:
                raise ValueError(
                    f"TASKLOCK_DEFAULTS['refresh_interval'] must be less than the ttl "
                    f"({resolved['refresh_interval']} >= {ttl})"
                )
        if "ttl" in resolved and "max_lifetime" in resolved:
            names = ("TASKLOCK_DEFAULTS['ttl']", "TASKLOCK_DEFAULTS['max_lifetime']")
            check_ttl_within_lifetime(resolved["ttl"], resolved["max_lifetime"], *names)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    return resolved


def check_ttl_within_lifetime(
    ttl: timedelta, max_lifetime: timedelta, ttl_name: str, lifetime_name: str
) -> None:
    """A chosen ttl longer than a chosen max_lifetime (once capped silently) is an error.

    A ttl the call did not choose (built-in, or the project's under a call's
    own ``max_lifetime``) still gives way to a shorter ``max_lifetime``.
    """
    if ttl > max_lifetime:
        raise ValueError(
            f"{ttl_name} must be at most {lifetime_name} ({ttl} > {max_lifetime}): "
            "no lease outlives acquisition + max_lifetime"
        )


@dataclasses.dataclass(frozen=True)
class LockOptions:
    """The lease's timing, validated: ``1 ms <= refresh_interval < ttl <= 24 h``,
    ``max_lifetime`` from 1 ms to 24 h, a ``ttl`` chosen with a ``max_lifetime``
    no longer than it."""

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

        Invalid defaults raise ``ImproperlyConfigured`` (see
        :func:`project_defaults`); invalid call options ``TypeError`` or
        ``ValueError`` naming the parameter. ``refresh_interval`` defaults to
        the project's, unless that is not shorter than this call's ttl (a
        project-wide interval cannot know every call's ttl): then, as without
        one, to a third of the ttl. Results from the settings are remembered
        per argument values (and types, so ``True`` is never taken for ``1``)
        until ``TASKLOCK_DEFAULTS`` changes (``setting_changed``).
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
        project = project_defaults(defaults)

        def given(name: str, value: Duration | None) -> timedelta | None:
            return None if value is None else to_timedelta(name, value)

        call_ttl = given("ttl", ttl)
        call_interval = given("refresh_interval", refresh_interval)
        call_lifetime = given("max_lifetime", max_lifetime)
        ttl_td = call_ttl if call_ttl is not None else project.get("ttl", DEFAULT_TTL)
        interval_td = call_interval or project.get("refresh_interval")
        if interval_td is None or (call_interval is None and interval_td >= ttl_td):
            interval_td = ttl_td / 3
        if interval_td >= ttl_td:
            raise ValueError(
                f"refresh_interval must be less than ttl ({interval_td} >= {ttl_td}): "
                "the lease would expire between two refreshes"
            )
        lifetime_td = call_lifetime or project.get("max_lifetime")
        if call_ttl is not None and lifetime_td is not None:
            lifetime_name = "max_lifetime" if call_lifetime else "max_lifetime (TASKLOCK_DEFAULTS)"
            check_ttl_within_lifetime(call_ttl, lifetime_td, "ttl", lifetime_name)
        return cls(
            ttl=ttl_td,
            refresh_interval=interval_td,
            max_lifetime=lifetime_td if lifetime_td is not None else MAX_LIFETIME_LIMIT,
        )


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
    ``cancel_on_loss``: cancel the body at the declaration of a loss, which
    the caller sees as ``LockLost`` (``async with`` and ``arun_exclusive``
    only). ``progress_timeout``: extend the lease only while the work calls
    ``Lock.progress()`` within this long (seconds or timedelta; default: no
    such condition). Neither has a project-wide default in
    ``TASKLOCK_DEFAULTS``: each asks something of the work it guards.
    ``limit``: at most this many holders of the key at once (an int from 1,
    the default: one holder, to :data:`MAX_LIMIT`); each holds one of the
    key's permits, a lease of its own (``Lock.permit``). Every caller of one
    key must give the same limit (else ``LimitMismatch``). Per call only: not
    in ``TASKLOCK_DEFAULTS``, since it is a property of the key, not of a
    project. ``name``: what telemetry calls the lock (``tasklock.name``), one name for
    many keys (``"invoice"`` for ``f"invoice:{pk}"``); ``@exclusive``'s default is
    its key template. Without it no name is reported: never the key.
    """

    ttl: Duration | None
    refresh_interval: Duration | None
    max_lifetime: Duration | None
    wait: Duration | None
    min_hold: Duration | None
    fencing: bool
    cancel_on_loss: bool
    progress_timeout: Duration | None
    name: str | None
    limit: int


LOCK_KWARGS = frozenset(LockKwargs.__annotations__)


def check_lock_kwargs(
    options: Mapping[str, object],
    *,
    caller: str = "",
    refused: frozenset[str] = frozenset(),
    own: frozenset[str] = frozenset(),
) -> None:
    """A ``TypeError`` naming the first keyword that is not a lock option.

    ``caller`` (``"exclusive()"``) names the API whose keywords the message
    lists: the lock options but ``refused`` (which it does not take), and its
    ``own`` keywords besides them.
    """
    unknown = sorted(set(options) - LOCK_KWARGS)
    if unknown:
        accepted = sorted((LOCK_KWARGS - refused) | own)
        what = f"{caller} takes" if caller else "lock options are"
        raise TypeError(
            f"unexpected keyword argument {unknown[0]!r}; {what} {', '.join(accepted)}"
        )


def validate_name(value: object) -> str | None:
    """A lock's name for telemetry: None, or 1 to 255 characters of text."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"name must be a str or None, not {type(value).__name__}")
    if not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"name must be 1 to {MAX_NAME_LENGTH} characters, got {len(value)}")
    return value


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


def validate_progress_timeout(value: object) -> timedelta | None:
    """None (no condition on progress), or a duration from 1 ms to 24 h."""
    return None if value is None else to_timedelta("progress_timeout", value)


def validate_limit(value: object) -> int:
    """How many may hold the key at once: an int from 1 to :data:`MAX_LIMIT` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"limit must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_LIMIT}, got {value}")
    return value


def validate_limited_key(key: str, limit: int) -> None:
    """With ``limit`` of 2 or more, ``ValueError`` naming ``key`` if its permits' names
    would not fit the storage (``backends.base.check_limited_key``)."""
    if limit > 1:
        check_limited_key(key, limit)


def validate_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


# LockOptions.resolve's answers from the settings; see _forget_resolved().
_resolved: dict[tuple[tuple[object, ...], tuple[type, ...]], LockOptions] = {}
_RESOLVED_MAX = 256


def _forget_resolved(*, setting: str, **kwargs: Any) -> None:
    """Drop remembered options when ``TASKLOCK_DEFAULTS`` changes (``override_settings``)."""
    if setting == "TASKLOCK_DEFAULTS":
        _resolved.clear()


# Connected here, not in the app's ready(): the cache exists without the app too.
setting_changed.connect(_forget_resolved, dispatch_uid="django_tasklock.options")
