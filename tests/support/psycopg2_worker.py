"""The database backend on PostgreSQL through psycopg2, in a process of its own.

Django uses psycopg (3) whenever it can import it, so this process hides it
before Django starts: ``python -m tests.support.psycopg2_worker <postgres URL>``.
Prints the driver's name, then one line per call of the backend, then
whether the driver reports a transaction open under manual transaction
management.
"""

from __future__ import annotations

import sys

sys.modules["psycopg"] = None  # type: ignore[assignment]  # Django falls back to psycopg2

from datetime import timedelta  # noqa: E402

import django  # noqa: E402
from django.conf import settings  # noqa: E402

from tests.support import services  # noqa: E402


def main(url: str) -> None:
    settings.configure(
        SECRET_KEY="psycopg2",
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_tasklock"],
        DATABASES={"default": services.postgres_settings(url)},
    )
    django.setup()
    from django.db import connection

    from django_tasklock.backends.base import Refresh
    from django_tasklock.backends.database.backend import DatabaseBackend

    with connection.cursor() as cursor:  # this session's own table: nobody else's rows
        cursor.execute(
            "CREATE TEMP TABLE cache_entries (key varchar(255) PRIMARY KEY, value text, "
            "expires_at timestamptz, created_at timestamptz)"
        )
    print(connection.Database.__name__)  # type: ignore[attr-defined]
    backend = DatabaseBackend(using="default")
    ttl, cap = timedelta(seconds=30), timedelta(hours=1)
    print("acquire", backend.acquire("pg2-key", "h:1:tok", ttl=ttl, max_lifetime=cap))
    refreshed = backend.refresh_many([Refresh("pg2-key", "h:1:tok", ttl, cap)])
    print("refresh_many", refreshed)
    print("release", backend.release("pg2-key", "h:1:tok"))

    # What the release after work under AUTOCOMMIT: False asks the driver.
    from django_tasklock.locking.transactions import _transaction_open

    connection.set_autocommit(False)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    print("open after a query", _transaction_open(connection.connection))
    connection.commit()
    print("open after the commit", _transaction_open(connection.connection))


if __name__ == "__main__":
    main(sys.argv[1])
