"""The database backend's system checks: a lock database that cannot work.

Read from settings only: nothing connects. A missing ``"django_tasklock"`` in
``INSTALLED_APPS`` cannot be reported here (without the app nothing registers
these checks): first use raises ``ImproperlyConfigured`` naming
``INSTALLED_APPS`` instead.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.db import connections


def check_lock_database(alias: str) -> list[checks.CheckMessage]:
    """E006: ``alias`` (``TASKLOCK_DATABASE``) is not a database alias; W001: SQLite
    with ``ATOMIC_REQUESTS``."""
    errors: list[checks.CheckMessage] = []
    if alias not in settings.DATABASES:
        errors.append(
            checks.Error(
                f"TASKLOCK_DATABASE = {alias!r} is not a database alias.",
                hint=f"Use one of: {', '.join(settings.DATABASES)}.",
                id="django_tasklock.E006",
            )
        )
    elif _is_sqlite_with_atomic_requests(alias):
        errors.append(
            checks.Warning(
                f"ATOMIC_REQUESTS is on for the SQLite database {alias!r} that "
                "holds the task locks: every view taking a lock (@exclusive) fails, "
                "because SQLite has one writer and the view's transaction is it.",
                hint="Mark those views @transaction.non_atomic_requests, or keep the "
                "locks elsewhere: TASKLOCK_DATABASE naming another database, or "
                "TASKLOCK_BACKEND = 'redis'.",
                id="django_tasklock.W001",
            )
        )
    return errors


def _is_sqlite_with_atomic_requests(using: str) -> bool:
    connection = connections[using]  # a wrapper only: nothing connects
    return connection.vendor == "sqlite" and bool(connection.settings_dict["ATOMIC_REQUESTS"])
