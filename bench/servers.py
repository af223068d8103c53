"""The servers a run uses: scratch databases made for it and dropped after, Django set up.

PostgreSQL and MariaDB each get a database of their own (``tasklock_bench_<pid>``),
created through the URL's database and dropped at the end; SQLite a file in a
temporary directory. In Redis only this run's keys (``*bench-<run>-*``) are
written, and deleted at the end. Every lease is short, so a run killed with
``kill -9`` leaves only leases that expire by themselves (and, at worst, a
scratch database to drop by hand).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any
from urllib.parse import unquote, urlsplit

DEFAULT_URLS = {
    "postgres": "postgres://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql://root@127.0.0.1:3306/test",
    "redis": "redis://127.0.0.1:6379/14",
}
ENV = {name: f"TASKLOCK_BENCH_{name.upper()}_URL" for name in DEFAULT_URLS}
RUN = f"bench-{secrets.token_hex(3)}-"  # every key of this run starts with it
SCRATCH = f"tasklock_bench_{os.getpid()}"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def url(name: str) -> str:
    return os.environ.get(ENV[name]) or DEFAULT_URLS[name]


@dataclass
class Servers:
    """What answered: database aliases by backend name, the Redis URL, what was skipped."""

    aliases: dict[str, str] = field(default_factory=dict)  # "postgres" -> "default"
    redis_url: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    #: The same servers through a proxy that delays every request (``--latency``).
    far_aliases: dict[str, str] = field(default_factory=dict)  # "postgres" -> "postgres_far"
    far_redis_url: str | None = None


def _parts(raw: str) -> dict[str, Any]:
    parts = urlsplit(raw)
    return {
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


#: PostgreSQL OPTIONS of the run (``--server-side-binding`` sets them).
POSTGRES_OPTIONS: dict[str, Any] = {}


@contextmanager
def _postgres() -> Iterator[dict[str, Any]]:
    import psycopg

    base = _parts(url("postgres"))
    admin = psycopg.connect(
        dbname=base["NAME"],
        user=base["USER"],
        password=base["PASSWORD"] or None,
        host=base["HOST"],
        port=base["PORT"] or None,
        autocommit=True,
        connect_timeout=3,
    )
    admin.execute(f'CREATE DATABASE "{SCRATCH}"')
    try:
        yield {
            **base,
            "ENGINE": "django.db.backends.postgresql",
            "NAME": SCRATCH,
            "OPTIONS": dict(POSTGRES_OPTIONS),
        }
    finally:
        from django.db import connections

        connections.close_all()
        admin.execute(f'DROP DATABASE IF EXISTS "{SCRATCH}" WITH (FORCE)')
        admin.close()


@contextmanager
def _mariadb() -> Iterator[dict[str, Any]]:
    import MySQLdb

    base = _parts(url("mariadb"))
    admin = MySQLdb.connect(
        host=base["HOST"],
        user=base["USER"],
        password=base["PASSWORD"],
        port=int(base["PORT"] or 3306),
        connect_timeout=3,
    )
    admin.cursor().execute(f"CREATE DATABASE `{SCRATCH}`")
    try:
        yield {**base, "ENGINE": "django.db.backends.mysql", "NAME": SCRATCH}
    finally:
        from django.db import connections

        connections.close_all()
        admin.cursor().execute(f"DROP DATABASE IF EXISTS `{SCRATCH}`")
        admin.close()


def _redis_answers() -> bool:
    import redis

    client = redis.Redis.from_url(url("redis"), socket_connect_timeout=3)
    try:
        return bool(client.ping())
    finally:
        client.close()


@contextmanager
def started(wanted: list[str], delay: float | None = None) -> Iterator[Servers]:
    """Scratch databases for ``wanted`` backends, Django configured and migrated.

    With a ``delay`` (seconds), the networked servers are also reachable
    through proxies that hold every request that long (``far_aliases``).
    """
    servers = Servers()
    databases: dict[str, Any] = {}
    with ExitStack() as stack:
        for name, make in (("postgres", _postgres), ("mariadb", _mariadb)):
            if name not in wanted:
                continue
            try:
                databases[name] = stack.enter_context(make())
            except Exception as exc:  # any reason the server cannot be used
                servers.skipped[name] = f"{type(exc).__name__}: {exc}".strip()
        if "sqlite" in wanted:
            folder = tempfile.mkdtemp(prefix="tasklock-bench-")
            stack.callback(shutil.rmtree, folder, ignore_errors=True)
            databases["sqlite"] = {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": os.path.join(folder, "bench.sqlite3"),
            }
        if "redis" in wanted:
            try:
                if _redis_answers():
                    servers.redis_url = url("redis")
            except Exception as exc:
                servers.skipped["redis"] = f"{type(exc).__name__}: {exc}"
        # django-db-mutex and django-pglock use the "default" alias: PostgreSQL's.
        order = ["postgres", "sqlite", "mariadb"]
        names = [name for name in order if name in databases]
        for index, name in enumerate(names):
            servers.aliases[name] = "default" if index == 0 else name
        configured = {servers.aliases[n]: databases[n] for n in names}
        if delay:
            configured.update(_far(stack, servers, databases, delay))
        _configure(configured, servers.redis_url)
        from django.core.management import call_command

        for alias in servers.aliases.values():
            call_command("migrate", database=alias, verbosity=0)
        try:
            yield servers
        finally:
            _clean_redis(servers.redis_url)


def _far(
    stack: ExitStack, servers: Servers, databases: dict[str, Any], delay: float
) -> dict[str, Any]:
    """Proxied twins of the PostgreSQL and MariaDB aliases (and Redis URL): their settings."""
    import latency

    upstreams = {
        name: (str(databases[name]["HOST"]), int(databases[name]["PORT"] or default))
        for name, default in (("postgres", 5432), ("mariadb", 3306))
        if name in databases
    }
    if servers.redis_url:
        parts = urlsplit(servers.redis_url)
        upstreams["redis"] = (parts.hostname or "127.0.0.1", parts.port or 6379)
    ports = stack.enter_context(latency.proxied(delay, upstreams))
    out = {}
    for name, port in ports.items():
        if name == "redis":
            parts = urlsplit(servers.redis_url or "")
            credentials = parts.netloc.rpartition("@")[0]
            netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
            servers.far_redis_url = parts._replace(netloc=netloc).geturl()
        else:
            servers.far_aliases[name] = f"{name}_far"
            out[f"{name}_far"] = {**databases[name], "HOST": "127.0.0.1", "PORT": str(port)}
    return out


def _configure(databases: dict[str, Any], redis_url: str | None) -> None:
    import django
    from django.conf import settings

    if "default" not in databases:
        databases["default"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    apps = ["django.contrib.contenttypes", "django_tasklock"]
    if databases["default"]["ENGINE"].endswith("postgresql"):
        apps += ["db_mutex", "pgactivity", "pglock"]
    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=apps,
        USE_TZ=True,
        TASKLOCK_BACKEND="database",
        TASKLOCK_REDIS_URL=redis_url,
        DB_MUTEX_TTL_SECONDS=60,
        LOGGING_CONFIG=None,
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    django.setup()


def _clean_redis(redis_url: str | None) -> None:
    if redis_url is None:
        return
    import redis

    client = redis.Redis.from_url(redis_url)
    mine = list(client.scan_iter(match=f"*{RUN}*", count=1000))
    for start in range(0, len(mine), 500):
        client.delete(*mine[start : start + 500])
    client.close()


def versions(servers: Servers) -> dict[str, str]:
    """Library versions and the servers' own."""
    out = {"python": sys.version.split()[0]}
    for package in (
        "django-tasklock",
        "Django",
        "psycopg",
        "mysqlclient",
        "redis",
        "django-db-mutex",
        "django-pglock",
        "python-redis-lock",
    ):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    from django.db import connections

    for name, alias in servers.aliases.items():
        connection = connections[alias]
        if name == "sqlite":
            out["sqlite server"] = sqlite3.sqlite_version
            continue
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            out[f"{name} server"] = str(cursor.fetchone()[0]).split(" on ")[0]
    if servers.redis_url:
        import redis

        client = redis.Redis.from_url(servers.redis_url)
        out["redis server"] = str(client.info("server")["redis_version"])
        client.close()
    return out


def transport() -> dict[str, str]:
    """Where each server was reached (host:port of each URL; loopback TCP here)."""
    out = {}
    for name in DEFAULT_URLS:
        parts = urlsplit(url(name))
        out[name] = f"TCP {parts.hostname}:{parts.port}"
    out["sqlite"] = "a local file"
    return out
