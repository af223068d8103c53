"""``TASKLOCK_BACKEND = "postgres"``: the database backend, on PostgreSQL only.

The database backend works on any Django database, so "postgres" adds one
promise: the lock database really is PostgreSQL. A project that names
PostgreSQL and runs on SQLite (a test settings file, a forgotten
``DATABASES`` entry) would otherwise get SQLite's one-host locks without a
word; instead ``manage.py check`` reports E008 and first use raises
``ImproperlyConfigured``.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from django_tasklock.backends.database.backend import DatabaseBackend
from django_tasklock.conf import conf


def _vendor_problem(alias: str) -> str | None:
    """Why ``alias`` cannot hold "postgres" locks, or None. Reads settings only."""
    if alias not in connections.settings:
        return None  # E006 says so
    vendor = connections[alias].vendor
    if vendor == "postgresql":
        return None
    return (
        f'TASKLOCK_BACKEND = "postgres", but the lock database {alias!r} '
        f"(TASKLOCK_DATABASE) is {vendor}, not PostgreSQL."
    )


_HINT = (
    'Use TASKLOCK_BACKEND = "database" to keep locks in any database, or point '
    "TASKLOCK_DATABASE at a PostgreSQL database."
)


class PostgresBackend(DatabaseBackend):
    """The database backend, refusing a lock database that is not PostgreSQL."""

    @classmethod
    def from_settings(cls) -> PostgresBackend:
        problem = _vendor_problem(conf.DATABASE)
        if problem:
            raise ImproperlyConfigured(f"{problem} {_HINT}")
        return cls(using=conf.DATABASE)

    @classmethod
    def check(cls) -> list[Any]:
        """The database backend's checks, and E008: the lock database is not PostgreSQL."""
        errors = super().check()
        problem = _vendor_problem(conf.DATABASE)
        if problem:
            errors.append(checks.Error(problem, hint=_HINT, id="django_tasklock.E008"))
        return errors
