"""Who is timed: ours, the raw floor of each storage, and the libraries users would pick.

Each contender is one uncontended acquire + release cycle with a no-op body,
on the same server as the others of its group:

- ``ours``: ``TaskLockService(backend).run_exclusive(key, noop, ttl=60)``;
- ``limit3``: the same with ``limit=3``: one of the key's 3 permits per cycle
  (on the databases a transaction of 3 to 6 statements, on Redis one script
  on a hash), beside the mutex's cycle;
- ``raw``: the same statements with no library: the INSERT and the token DELETE
  our backend sends (compiled by the ORM once, then sent through the DB-API
  cursor of the same autocommit connection); for Redis ``SET NX PX`` then the
  classic compare-and-delete script by EVALSHA;
- ``orm_floor`` (databases): a plain ``CacheEntry.objects.create(...)`` with the
  same values, then the same compiled token DELETE: the least a design that
  keeps ``create()`` and its ``IntegrityError`` can cost (on PostgreSQL ours
  sends that DELETE inside the statement that wakes other processes' waiters;
  ``raw`` and ``orm_floor`` send the DELETE alone);
- peers: django-db-mutex and django-pglock's advisory lock (PostgreSQL),
  redis-py's ``Lock`` and python-redis-lock with ``auto_renewal=True`` (Redis).
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from servers import RUN, Servers

TTL = timedelta(seconds=60)
TOKEN_HOST = f"{socket.gethostname()}:0:"
COMPARE_AND_DELETE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)

Op = Callable[[], None]


@dataclass
class Contender:
    group: str  # the storage: postgres, sqlite, mariadb, redis
    name: str  # ours, raw, django_db_mutex, ...
    label: str  # for the table and chart
    op: Op
    note: str = ""


class BenchError(RuntimeError):
    """A cycle did not do what it should: the numbers would mean nothing."""


def check(ok: object, what: str) -> None:
    if not ok:
        raise BenchError(what)


def _noop() -> None:
    return None


def ours(group: str, backend: Any) -> Contender:
    from django_tasklock.api.service import TaskLockService

    service = TaskLockService(backend)
    key = f"{RUN}{group}-ours"

    def op() -> None:
        check(service.run_exclusive(key, _noop, ttl=TTL).acquired, "ours: not acquired")

    return Contender(group, "ours", "django-tasklock run_exclusive", op)


def ours_limited(group: str, backend: Any) -> Contender:
    """``ours`` with ``limit=3``: a permit per cycle (the others free: uncontended)."""
    from django_tasklock.api.service import TaskLockService

    service = TaskLockService(backend)
    key = f"{RUN}{group}-limit3"

    def op() -> None:
        result = service.run_exclusive(key, _noop, ttl=TTL, limit=3)
        check(result.acquired, "ours, limit=3: not acquired")

    return Contender(group, "limit3", "django-tasklock run_exclusive, limit=3", op)


def raw_database(group: str, alias: str) -> Contender:
    """Our INSERT and token DELETE, compiled once, on the alias's own DB-API connection."""
    from django.db import connections
    from django.db.models import sql
    from django.db.models.functions import Now

    from django_tasklock.backends.database.statements import Release
    from django_tasklock.models import CacheEntry

    stored = f"task-lock:{RUN}{group}-raw"
    token = TOKEN_HOST + secrets.token_urlsafe(18)
    row = CacheEntry(key=stored, value=token, expires_at=Now() + TTL, created_at=Now())
    insert = sql.InsertQuery(CacheEntry)
    insert.insert_values(CacheEntry._meta.concrete_fields, [row])
    [(insert_sql, insert_params)] = insert.get_compiler(alias).as_sql()
    delete = Release(CacheEntry, alias, live_only=True)
    connection = connections[alias]
    connection.ensure_connection()
    cursor = connection.connection.cursor()
    delete_params = delete.params(stored, token)
    delete_sql = delete.sql
    if connection.vendor == "sqlite":  # what Django's cursor wrapper does to a query
        insert_sql, delete_sql = (_qmark(insert_sql), _qmark(delete_sql))

    def op() -> None:
        cursor.execute(insert_sql, insert_params)
        cursor.execute(delete_sql, delete_params)
        check(cursor.rowcount == 1, "raw: DELETE removed no row")

    return Contender(group, "raw", "raw driver, same SQL", op)


def orm_floor(group: str, alias: str) -> Contender:
    """``CacheEntry.objects.create()`` with our values, then our compiled token DELETE."""
    from django.db import connections

    from django_tasklock.backends.database.functions import UtcNow
    from django_tasklock.backends.database.statements import Release
    from django_tasklock.models import CacheEntry

    stored = f"task-lock:{RUN}{group}-floor"
    token = TOKEN_HOST + secrets.token_urlsafe(18)
    expires_at = UtcNow() + TTL
    delete = Release(CacheEntry, alias, live_only=True)
    manager = CacheEntry.objects.db_manager(alias)
    connections[alias].ensure_connection()

    # The plain DELETE, not the statement ours sends (on PostgreSQL it also wakes
    # waiters of other processes): the floor has no such work.
    delete_params = delete.params(stored, token)

    def op() -> None:
        manager.create(key=stored, value=token, expires_at=expires_at, created_at=UtcNow())
        with connections[alias].cursor() as cursor:
            cursor.execute(delete.sql, delete_params)
            check(cursor.rowcount == 1, "ORM floor: DELETE removed no row")

    return Contender(group, "orm_floor", "ORM create() + same DELETE", op)


def _qmark(query: str) -> str:
    from django.db.backends.sqlite3.base import FORMAT_QMARK_REGEX

    return FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


def raw_redis(client: Any) -> Contender:
    from redis.exceptions import NoScriptError

    sha = client.script_load(COMPARE_AND_DELETE)
    key = f"task-lock:{RUN}redis-raw"
    token = TOKEN_HOST + secrets.token_urlsafe(18)
    ttl_ms = int(TTL.total_seconds() * 1000)

    def op() -> None:
        nonlocal sha
        check(client.set(key, token, nx=True, px=ttl_ms), "raw: SET NX failed")
        try:
            deleted = client.evalsha(sha, 1, key, token)
        except NoScriptError:  # the server's script cache was flushed (as ours handles)
            sha = client.script_load(COMPARE_AND_DELETE)
            deleted = client.evalsha(sha, 1, key, token)
        check(deleted == 1, "raw: compare-and-delete failed")

    return Contender("redis", "raw", "redis-py SET NX PX + EVALSHA", op)


def django_db_mutex() -> Contender:
    from db_mutex.db_mutex import db_mutex

    key = f"{RUN}db-mutex"

    def op() -> None:
        with db_mutex(key):
            pass

    return Contender("postgres", "django_db_mutex", "django-db-mutex", op)


def django_pglock() -> Contender:
    import pglock

    key = f"{RUN}pglock"

    def op() -> None:
        with pglock.advisory(key, timeout=0) as acquired:
            check(acquired, "pglock: not acquired")

    return Contender(
        "postgres",
        "django_pglock",
        "django-pglock advisory",
        op,
        note="session advisory lock: no TTL, no heartbeat, held by the connection "
        "(unusable behind PgBouncer transaction pooling); other guarantees",
    )


def redis_py_lock(client: Any) -> Contender:
    lock = client.lock(f"{RUN}redis-py-lock", timeout=TTL.total_seconds())

    def op() -> None:
        check(lock.acquire(blocking=False), "redis-py Lock: not acquired")
        lock.release()

    return Contender(
        "redis", "redis_py_lock", "redis-py Lock", op, note="no heartbeat: expires after timeout"
    )


def python_redis_lock(client: Any) -> Contender:
    import redis_lock

    key = f"{RUN}python-redis-lock"

    def op() -> None:
        lock = redis_lock.Lock(client, key, expire=int(TTL.total_seconds()), auto_renewal=True)
        check(lock.acquire(blocking=False), "python-redis-lock: not acquired")
        lock.release()

    return Contender("redis", "python_redis_lock", "python-redis-lock auto_renewal", op)


def all_contenders(servers: Servers) -> list[Contender]:
    """Every contender whose server answered and whose package is installed."""
    out = contenders_of(servers.aliases, servers.redis_url)
    if "postgres" in servers.aliases:  # on the "default" alias: PostgreSQL's
        out[3:3] = [django_db_mutex(), django_pglock()]
    return out


def contenders_of(aliases: dict[str, str], redis_url: str | None) -> list[Contender]:
    """Ours, the ORM floor and raw on each database alias; ours, raw and peers on Redis."""
    from django_tasklock.backends.database import DatabaseBackend
    from django_tasklock.backends.redis import RedisBackend

    out: list[Contender] = []
    for group, alias in aliases.items():
        out += [ours(group, DatabaseBackend(using=alias)), orm_floor(group, alias)]
        out.append(raw_database(group, alias))
        out.append(ours_limited(group, DatabaseBackend(using=alias)))
    if redis_url:
        import redis

        # Our backend and every Redis contender get the same kind of client.
        out.append(ours("redis", RedisBackend(url=redis_url)))
        client = redis.Redis.from_url(redis_url, socket_timeout=10)
        out += [raw_redis(client), redis_py_lock(client), python_redis_lock(client)]
        out.append(ours_limited("redis", RedisBackend(url=redis_url)))
    return out
