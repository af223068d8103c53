"""System checks: a misconfiguration is reported by ``manage.py check``, never at import.

Registered by the app's ``AppConfig.ready()``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_tasklock.conf import conf

logger = logging.getLogger("django_tasklock")


def check_tasklock_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django_tasklock.backends import BUILTIN_BACKENDS, backend_class
    from django_tasklock.locking.options import project_defaults

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
        # The same validation as at run time, so check and run time agree.
        project_defaults()
    except ImproperlyConfigured as exc:
        errors.append(
            checks.Error(
                f"TASKLOCK_DEFAULTS is invalid: {exc}",
                hint="TASKLOCK_DEFAULTS takes ttl, refresh_interval and max_lifetime as "
                "seconds or timedeltas from 1 ms to 24 h, with refresh_interval < ttl "
                "(the built-in ttl, 15 minutes, when it names none) and ttl <= max_lifetime "
                "when it names both.",
                id="django_tasklock.E007",
            )
        )
    errors.extend(_cache_table_conflicts())
    return errors


#: The table django-tasklock's migration creates (``CacheEntry``).
LOCK_TABLE = "cache_entries"


def _cache_table_conflicts() -> list[checks.CheckMessage]:
    """``E012``: a Django database cache whose table is ``cache_entries``, the lock's.

    Its ``createcachetable`` and our migration both create the table, with other
    columns: ``migrate`` then fails ("table "cache_entries" already exists").
    """
    from django.conf import settings

    found: list[checks.CheckMessage] = []
    for alias, cache in getattr(settings, "CACHES", {}).items():
        backend = str(cache.get("BACKEND", ""))
        if backend.endswith("DatabaseCache") and cache.get("LOCATION") == LOCK_TABLE:
            found.append(
                checks.Error(
                    f"The cache {alias!r} (Django's database cache) keeps its entries in the "
                    f"table {LOCK_TABLE!r}, which django-tasklock's migration creates for its "
                    "locks, with other columns: manage.py migrate fails with "
                    f'"table {LOCK_TABLE!r} already exists".',
                    hint=(
                        f'Give the cache another table: CACHES[{alias!r}]["LOCATION"] = '
                        '"django_cache", then run manage.py createcachetable (the cached '
                        f"entries start empty). If {LOCK_TABLE} was made by createcachetable, "
                        "drop it before migrating."
                    ),
                    id="django_tasklock.E012",
                )
            )
    return found


def check_health_setting(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django_tasklock.ops.health import limits

    try:
        limits()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="TASKLOCK_HEALTH maps key patterns ('*' or a template's {field} matches "
                "any characters) to a max_held duration, or to a dict of max_held, ttl, "
                "refresh_interval and max_lifetime, each seconds or a timedelta.",
                id="django_tasklock.E010",
            )
        ]
    return []


def check_lock_storage(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Deploy check (tag ``tasklock``): a storage that may drop a live lease by itself.

    ``W002``: the lock's Redis has a ``maxmemory-policy`` other than
    ``noeviction`` (read with ``CONFIG GET``; on a cluster, of every master). A
    backend that cannot be built is reported by the errors of
    :func:`check_tasklock_settings`; a Redis that cannot be reached, or that
    refuses ``CONFIG GET`` (managed Redis), is not reported here.
    """
    from django_tasklock.api.service import TaskLockService
    from django_tasklock.backends.redis import RedisBackend

    try:
        backend = TaskLockService().backend
    except ImproperlyConfigured:
        return []  # E001-E011
    if not isinstance(backend, RedisBackend):
        return []
    try:
        return backend.eviction_check()
    except Exception:
        logger.debug("The lock's Redis could not be asked its maxmemory-policy.", exc_info=True)
        return []


_HINTS = {
    "held_too_long": (
        "django_tasklock.W010",
        "manage.py tasklock list shows its holder (host and pid); if it may run this "
        "long, raise max_held in TASKLOCK_HEALTH.",
    ),
    "refresh_overdue": (
        "django_tasklock.W011",
        "Its holder's refreshes are late or stopped (a slow or blocked storage, a paused "
        "process): manage.py tasklock list shows the holder. If its lock uses another ttl "
        "or refresh_interval, give them in its TASKLOCK_HEALTH entry.",
    ),
    "ttl_not_the_locks": (
        "django_tasklock.W015",
        "Give the TASKLOCK_HEALTH entry the ttl (and refresh_interval) its locks are "
        'taken with, e.g. {"max_held": 600, "ttl": 60}: without them it assumes the '
        "defaults (15 min, and a third of it).",
    ),
    "storage_unreachable": (
        "django_tasklock.W014",
        "The lock storage (TASKLOCK_BACKEND) does not answer this process's refreshes: "
        "its locks are lost once their ttl runs out (lock.lost, lock_lost). The WARNING "
        "log lines 'Refreshing task lock ... failed' carry the error.",
    ),
    "holder_gone": (
        "django_tasklock.W016",
        "Nothing on its holder's machine has taken it over or reaped it yet (no process "
        "there holds a lock); it is free once its ttl runs out, or release it now: "
        "manage.py tasklock release KEY.",
    ),
    "heartbeat_behind": (
        "django_tasklock.W012",
        "This process's refreshes wait on the lock storage: look for a slow or blocked "
        "database (a row lock) or Redis.",
    ),
}


def check_lock_health(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Deploy check (tag ``tasklock``): locks held too long, heartbeats behind.

    Reads the storage only when ``TASKLOCK_HEALTH`` names patterns; a storage
    that cannot be read is a warning (``W013``), not an error.
    """
    from django_tasklock.api.service import TaskLockService
    from django_tasklock.ops.health import heartbeat_findings, lease_findings, limits

    found = heartbeat_findings()
    messages: list[checks.CheckMessage] = []
    try:
        entries = limits()
    except ImproperlyConfigured:
        entries = []  # reported as E010 by check_health_setting
    if entries:
        try:
            found += lease_findings(TaskLockService().backend.list(), entries)
        except Exception as exc:
            messages.append(
                checks.Warning(
                    f"Could not list the task locks to check their health: "
                    f"{type(exc).__name__}: {exc}",
                    hint="Is the lock storage (TASKLOCK_BACKEND) reachable from here?",
                    id="django_tasklock.W013",
                )
            )
    warnings: list[checks.CheckMessage] = []
    for finding in found:
        check_id, hint = _HINTS[finding.kind]
        warnings.append(checks.Warning(finding.describe(), hint=hint, id=check_id))
    return warnings + messages
