"""Where databases differ: the time is UTC by the server's clock, keys compare byte for byte.

MySQL/MariaDB's ``CURRENT_TIMESTAMP`` is the session's local time, PostgreSQL
returns times in the session's zone (naive ones when ``USE_TZ = False``), and
SQLite's ``LIKE`` ignores ASCII case: none of it may change who holds a key or
the times the backend reports.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connections
from django.test import override_settings

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import HeldLock
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.connections import add_thread_connection
from django_tasklock.models import CacheEntry
from tests.conftest import DATABASE_ALIASES, require_service

pytestmark = pytest.mark.databases

TTL, LIFE = timedelta(minutes=15), timedelta(hours=1)

# A session in UTC and one an hour ahead of it, in each database's own syntax.
_ZONES = {"mysql": ("+00:00", "+01:00"), "postgresql": ("UTC", "Etc/GMT-1")}
_SET_ZONE = {"mysql": "SET time_zone = %s", "postgresql": "SET TIME ZONE %s"}


@pytest.fixture(params=["default", "postgres", "mariadb"], ids=["sqlite", "postgres", "mariadb"])
def alias(request: pytest.FixtureRequest) -> str:
    if request.param not in DATABASE_ALIASES:
        require_service(request.param)
    return str(request.param)


@pytest.fixture(params=[True, False], ids=["use_tz", "no_tz"])
def use_tz(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Django's USE_TZ, with every connection opened afresh under it."""
    with override_settings(USE_TZ=request.param):
        for alias in DATABASE_ALIASES:
            connections[alias].close()
        yield bool(request.param)
    for alias in DATABASE_ALIASES:
        connections[alias].close()


@pytest.fixture
def sessions(alias: str, use_tz: bool) -> Iterator[tuple[DatabaseBackend, DatabaseBackend]]:
    """Two backends on ``alias`` whose sessions' time zones are an hour apart.

    SQLite has no session zone: both are plain connections there.
    """
    vendor = connections[alias].vendor
    made = []
    for number, zone in enumerate(_ZONES.get(vendor, ("", ""))):
        name = f"{alias}_zone{number}"
        connection = add_thread_connection(name, dict(connections[alias].settings_dict))
        connection.ensure_connection()
        if zone:
            with connection.cursor() as cursor:
                cursor.execute(_SET_ZONE[vendor], [zone])
        made.append(DatabaseBackend(using=name))
    yield made[0], made[1]
    for backend in made:
        backend.close()


def _assert_true_utc(held: HeldLock, ttl: timedelta, before: datetime) -> None:
    """Aware UTC, and the real moments (this host is the server's, so their clocks agree)."""
    after = datetime.now(timezone.utc)
    for moment in (held.acquired_at, held.expires_at):
        assert moment.utcoffset() == timedelta(0), moment
    slack = timedelta(seconds=5)
    assert before - slack <= held.acquired_at <= after + slack
    assert before + ttl - slack <= held.expires_at <= after + ttl + slack
    assert ttl.total_seconds() - 5 <= held.seconds_left <= ttl.total_seconds()


def test_sessions_in_other_time_zones_cannot_take_a_live_lease(
    sessions: tuple[DatabaseBackend, DatabaseBackend], key: str
) -> None:
    utc, ahead = sessions
    for first, second in ((utc, ahead), (ahead, utc)):
        token = new_token()
        assert first.acquire(key, token, ttl=TTL, max_lifetime=LIFE)
        assert not second.acquire(key, new_token(), ttl=TTL, max_lifetime=LIFE)
        # The holder's heartbeat runs on a connection of its own.
        assert second.refresh(key, token, ttl=TTL, max_lifetime=LIFE)
        assert first.clear_stale() == 0
        assert first.release(key, token)


def test_peek_and_list_are_aware_utc_whatever_the_session_zone(
    sessions: tuple[DatabaseBackend, DatabaseBackend], key: str
) -> None:
    before = datetime.now(timezone.utc)
    token = new_token()
    assert sessions[1].acquire(key, token, ttl=TTL, max_lifetime=LIFE)
    for backend in sessions:
        held = backend.peek(key)
        assert held is not None
        _assert_true_utc(held, TTL, before)
        (listed,) = [each for each in backend.list() if each.key == key]
        _assert_true_utc(listed, TTL, before)
    assert sessions[0].release(key, token)


def test_peek_is_aware_utc_on_the_configured_connection(
    alias: str, use_tz: bool, key: str
) -> None:
    backend = DatabaseBackend(using=alias)
    before = datetime.now(timezone.utc)
    token = new_token()
    assert backend.acquire(key, token, ttl=TTL, max_lifetime=LIFE)
    held = backend.peek(key)
    assert held is not None
    _assert_true_utc(held, TTL, before)
    assert backend.release(key, token)


def test_key_column_is_byte_for_byte(alias: str) -> None:
    # Straight through the ORM, as any other user of the table would see it.
    rows = CacheEntry.objects.using(alias)
    now = datetime.now(timezone.utc)
    for stored in (
        "cache:Report",
        "cache:report",
        "cache:report ",
        "cache:résumé",
        "cache:resume",
    ):
        rows.create(key=stored, value="v", expires_at=now, created_at=now)
    assert rows.filter(key="cache:report").count() == 1
    assert rows.filter(key__startswith="cache:").count() == 5


def _key_collation(alias: str) -> str | None:
    """The collation of ``cache_entries.key`` on MySQL/MariaDB, else None."""
    connection = connections[alias]
    if connection.vendor != "mysql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
            "DATABASE() AND TABLE_NAME = 'cache_entries' AND COLUMN_NAME = 'key'"
        )
        return str(cursor.fetchone()[0])


def test_binary_key_migration_goes_back_and_forth(alias: str) -> None:
    from django.core.management import call_command

    binary = _key_collation(alias)
    try:
        call_command("migrate", "django_tasklock", "0001", database=alias, verbosity=0)
        folding = _key_collation(alias)
    finally:
        call_command("migrate", "django_tasklock", database=alias, verbosity=0)
    assert _key_collation(alias) == binary
    if connections[alias].vendor == "mysql":
        assert binary is not None
        assert binary.endswith("_bin")
        assert folding != binary


def test_a_compiled_value_inserts_what_the_plain_expression_does(alias: str) -> None:
    """``Compiled`` (resolved and compiled once) sends the plain expression's SQL, every time."""
    from django.test.utils import CaptureQueriesContext

    from django_tasklock.backends.database.functions import Compiled, UtcNow

    rows = CacheEntry.objects.using(alias)
    ends = Compiled(UtcNow() + TTL)
    began = Compiled(UtcNow())
    with CaptureQueriesContext(connections[alias]) as sent:
        rows.create(key="cache:plain", value="v", expires_at=UtcNow() + TTL, created_at=UtcNow())
        for n in (1, 2):  # the first compiles, the second answers from the cache
            rows.create(key=f"cache:compiled-{n}", value="v", expires_at=ends, created_at=began)
    plain, *compiled = (query["sql"] for query in sent.captured_queries)
    assert compiled == [plain.replace("cache:plain", f"cache:compiled-{n}") for n in (1, 2)]
    stored = rows.filter(key__startswith="cache:").order_by("key")
    times = {row.key: (row.expires_at - row.created_at) for row in stored}
    assert times == dict.fromkeys(["cache:compiled-1", "cache:compiled-2", "cache:plain"], TTL)
