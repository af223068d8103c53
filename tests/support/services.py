"""Where the test suite finds PostgreSQL, MariaDB and Redis.

First the environment (``TASKLOCK_TEST_POSTGRES_URL``, ``TASKLOCK_TEST_MARIADB_URL``,
``TASKLOCK_TEST_REDIS_URL``),
then a testcontainers container when a Docker engine answers, else nothing:
those tests then skip with a reason, except under ``CI=true``, where a missing
service fails the run.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
POSTGRES_ENV = "TASKLOCK_TEST_POSTGRES_URL"
MARIADB_ENV = "TASKLOCK_TEST_MARIADB_URL"
REDIS_ENV = "TASKLOCK_TEST_REDIS_URL"
#: The port of the PgBouncer a test process started, for the processes its tests start.
PGBOUNCER_PORT_ENV = "TASKLOCK_TEST_PGBOUNCER_PORT"

#: Why a service is missing, for skip messages.
missing: dict[str, str] = {}
#: How to stop the servers the test run started itself, by name.
stoppers: dict[str, Callable[[], None]] = {}


def _docker_available() -> bool:
    """Whether a Docker engine answers, leaving no socket open.

    docker-py leaves the socket of a connection that failed to the garbage
    collector, and under ``filterwarnings = error`` its ``ResourceWarning``
    fails whichever test runs when it is collected. So where docker-py has no
    engine to ask (no ``DOCKER_HOST``, no default socket) nothing is asked;
    otherwise what it leaves is collected here, its warning ignored.
    """
    if not os.environ.get("DOCKER_HOST") and not (
        sys.platform == "win32" or os.path.exists("/var/run/docker.sock")
    ):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env()
            try:
                client.ping()
            finally:
                client.close()
        except Exception:
            return False
        finally:
            gc.collect()
    return True


def _from_container(name: str) -> str | None:
    if os.environ.get("TASKLOCK_TEST_NO_DOCKER") or not _docker_available():
        return None
    if name == "postgres":
        from testcontainers.postgres import PostgresContainer

        pg = PostgresContainer("postgres:16-alpine", driver=None)
        pg.start()
        atexit.register(pg.stop)
        return str(pg.get_connection_url())
    if name == "mariadb":
        from testcontainers.mysql import MySqlContainer

        # root: Django creates and drops the per-run test database.
        maria = MySqlContainer("mariadb:10.11", username="root", password="test")
        maria.start()
        atexit.register(maria.stop)
        return str(maria.get_connection_url())
    from testcontainers.redis import RedisContainer

    redis = RedisContainer("redis:7-alpine")
    redis.start()
    atexit.register(redis.stop)
    return f"redis://{redis.get_container_host_ip()}:{redis.get_exposed_port(6379)}/15"


def service_url(name: str, env: str) -> str | None:
    url = os.environ.get(env) or _from_container(name)
    if url and name == "redis":
        url = _redis_database_of_this_worker(url)
        os.environ[env] = url  # the worker processes a test starts use it too
    if url:
        return url
    _missing(name, f"{name} not available: set {env} or make a Docker engine reachable")
    return None


def _redis_database_of_this_worker(url: str) -> str:
    """Under pytest-xdist, each worker gets a Redis database of its own.

    The SQL databases are per process already (their test names carry the pid);
    Redis has no per-run database, and tests that list every lock or flush their
    database must not see another worker's keys. Worker ``gwN`` takes the URL's
    database minus N (modulo 16, Redis's default number of databases), minus
    ``TASKLOCK_TEST_REDIS_DB_SHIFT`` when set (tox.ini sets it per Django
    version, so that environments run side by side with ``tox -p`` do not share
    a database).
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    shift = int(os.environ.get("TASKLOCK_TEST_REDIS_DB_SHIFT") or "0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    parts = urlsplit(url)
    if not index + shift or parts.scheme not in {"redis", "rediss"}:
        return url
    mark = f"{worker}+{shift}"
    if os.environ.get(_REDIS_SHIFTED_FOR) == mark:
        return url  # shifted already (service_url is called more than once)
    os.environ[_REDIS_SHIFTED_FOR] = mark
    base = int(parts.path.strip("/") or "0")
    return parts._replace(path=f"/{(base - shift - index) % 16}").geturl()


#: The xdist worker whose database ``REDIS_ENV`` names already (inherited by its subprocesses).
_REDIS_SHIFTED_FOR = "TASKLOCK_TEST_REDIS_WORKER"


def _missing(name: str, reason: str) -> None:
    """Record why ``name`` is missing, for skips; under ``CI=true`` that fails the run."""
    if IN_CI:
        raise RuntimeError(f"CI=true and {reason}")
    missing[name] = reason


def postgres_settings(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/") or "postgres",
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 5432),
    }


def mariadb_settings(url: str) -> dict[str, Any]:
    """Django settings for a ``mysql://user:password@host:port/name`` URL (MariaDB or MySQL)."""
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.mysql",
        "NAME": parts.path.lstrip("/") or "test",
        "USER": unquote(parts.username or "root"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 3306),
    }


def child_env() -> dict[str, str]:
    """The environment for a pytest run a test starts: a run of its own, which starts
    (and stops) its own PgBouncer rather than use its starter's."""
    return {name: value for name, value in os.environ.items() if name != PGBOUNCER_PORT_ENV}


def pgbouncer_settings(postgres: dict[str, Any]) -> dict[str, Any] | None:
    """A database alias through PgBouncer in transaction pooling, in front of ``postgres``.

    PgBouncer is started here, for the whole run, on a free loopback port; a
    process started by a test uses its test process's (``PGBOUNCER_PORT_ENV``).
    Django must not use server-side cursors behind transaction pooling.
    """
    from tests.support.servers import pgbouncer_binary, start_pgbouncer

    if pgbouncer_binary() is None:
        _missing("pgbouncer", "pgbouncer not available: apt-get install pgbouncer")
        return None
    inherited = os.environ.get(PGBOUNCER_PORT_ENV)
    if inherited and "PYTEST_CURRENT_TEST" in os.environ:
        # A process a test started (a holder, a task worker): its test process's
        # PgBouncer, not one of its own, which a test that kills it would leave running.
        port = int(inherited)
    else:
        port, stop = start_pgbouncer(postgres["HOST"], int(postgres["PORT"]))
        stoppers["pgbouncer"] = stop
        atexit.register(stop)
        os.environ[PGBOUNCER_PORT_ENV] = str(port)  # for the processes its tests start
    return {
        **postgres,
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "DISABLE_SERVER_SIDE_CURSORS": True,
        "TEST": {"MIRROR": "postgres"},
    }
