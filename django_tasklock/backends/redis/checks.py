"""The Redis backend's system checks: a missing package, a bad URL, a cache that is not Redis.

:func:`check_redis` reads settings and installed packages only: nothing
connects to Redis there (``manage.py check``, ``runserver``, ``migrate``).
Whether the server may evict a live lease (its ``maxmemory-policy``) can only
be read from the server: :func:`eviction_warnings`, at
``manage.py check --deploy`` (never at first use: one more round trip there
would double the time a call takes to fail while Redis does not answer).
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_tasklock.backends.redis.replicas import ack_from_settings
from django_tasklock.backends.redis.urls import FORMS, RedisURLError, parse_url
from django_tasklock.conf import conf

#: The PyPI names of what the Redis backend imports: these install from anywhere.
PACKAGES = {"redis": "redis", "django_redis": "django-redis"}

#: The warning that the lock's Redis may evict a live lease.
EVICTION_ID = "django_tasklock.W002"
#: The one ``maxmemory-policy`` under which Redis never evicts a lease.
SAFE_POLICY = "noeviction"
EVICTION_HINT = (
    f"Set maxmemory-policy {SAFE_POLICY} on the lock's Redis (CONFIG SET maxmemory-policy "
    f"{SAFE_POLICY}, and in redis.conf or your provider's parameter group), or give the "
    "locks a Redis of their own, without a cache beside them. A lease evicted is a second "
    "holder: another worker acquires the key at once while the first runs on, not told "
    "before its next refresh finds the lease gone. Every lease has a TTL, so every "
    "volatile-* policy may evict one (volatile-ttl those nearest their expiry first, as "
    "leases often are), and every allkeys-* policy may evict any key. Under "
    f"{SAFE_POLICY} a full Redis refuses the write instead: the acquisition fails with "
    "an error, and nobody holds the key twice."
)

logger = logging.getLogger("django_tasklock")


def check_redis() -> list[checks.CheckMessage]:
    """E002: redis-py (or, without a URL, django-redis) is missing; E009: the URL.

    E003-E004: the cache, when no URL is set. E011: the replica acknowledgement settings.
    """
    needed = ["redis"] if conf.REDIS_URL else ["redis", "django_redis"]
    missing = [PACKAGES[module] for module in needed if not _importable(module)]
    errors: list[checks.CheckMessage] = []
    if missing:
        shown = " and ".join("redis-py" if name == "redis" else name for name in missing)
        errors.append(
            checks.Error(
                f"The Redis lock backend needs {shown}, which cannot be imported.",
                hint=f"pip install {' '.join(missing)} (django-redis lets the lock share a "
                "django-redis cache's connection pool, TASKLOCK_REDIS_CACHE; with "
                "TASKLOCK_REDIS_URL, redis alone is enough).",
                id="django_tasklock.E002",
            )
        )
    try:
        ack_from_settings()  # the same reading as at first use
    except ImproperlyConfigured as exc:
        errors.append(
            checks.Error(
                str(exc),
                hint="TASKLOCK_REDIS_MIN_REPLICAS is a whole number (0: no acknowledgement); "
                "TASKLOCK_REDIS_REPLICA_TIMEOUT is seconds or a timedelta, 1 ms to 24 h.",
                id="django_tasklock.E011",
            )
        )
    if conf.REDIS_URL:
        try:
            # The same reading as at first use, so check and first use agree.
            parse_url(conf.REDIS_URL)
        except RedisURLError as exc:
            errors.append(
                checks.Error(
                    f"{exc.setting}: {exc.problem}.",
                    hint=f"Give TASKLOCK_REDIS_URL one of the forms {FORMS}.",
                    id="django_tasklock.E009",
                )
            )
        return errors
    alias = conf.REDIS_CACHE
    cache = settings.CACHES.get(alias)
    if cache is None:
        errors.append(
            checks.Error(
                f"TASKLOCK_REDIS_CACHE names the cache {alias!r}, which is not in CACHES.",
                hint="Add a django-redis cache under that alias, or set TASKLOCK_REDIS_URL.",
                id="django_tasklock.E003",
            )
        )
    elif not str(cache.get("BACKEND", "")).startswith("django_redis."):
        errors.append(
            checks.Error(
                f"The cache {alias!r} (TASKLOCK_REDIS_CACHE) is not a django-redis cache.",
                hint='Give it BACKEND "django_redis.cache.RedisCache", or set TASKLOCK_REDIS_URL.',
                id="django_tasklock.E004",
            )
        )
    return errors


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def read_policies(client: Any) -> list[tuple[str, str]]:
    """``(server, maxmemory-policy)`` for each server of ``client`` that says (``CONFIG GET``).

    A plain client asks its server; a ``RedisCluster``, every node it knows
    (its masters: replicas are not asked, and a replica promoted in a failover
    holds leases, so give them the masters' policy). A server that
    refuses (``CONFIG`` disabled or renamed, as managed Redis services do, or
    an ACL without it) or answers nothing is left out: its policy cannot be
    known from here. On a plain client a connection error propagates (the
    backend's first use fails with it, as its first script would have); a
    cluster node that cannot be reached is left out.
    """
    from redis.cluster import RedisCluster
    from redis.exceptions import ConnectionError, ResponseError, TimeoutError

    if not isinstance(client, RedisCluster):
        try:
            policy = _policy(client)
        except ResponseError:
            logger.debug("The lock's Redis refuses CONFIG GET: its maxmemory-policy is unknown.")
            return []
        return [(_server(client), policy)] if policy else []
    found = []
    nodes = client.get_nodes()  # type: ignore[no-untyped-call]
    for node in sorted(nodes, key=lambda known: known.name):
        try:
            policy = _policy(client.get_redis_connection(node))
        except (ConnectionError, TimeoutError, ResponseError):
            logger.debug("No maxmemory-policy from the Redis node %s.", node.name, exc_info=True)
            continue
        if policy:
            found.append((node.name, policy))
    return found


def eviction_warnings(policies: list[tuple[str, str]]) -> list[checks.CheckMessage]:
    """W002 when a server's ``maxmemory-policy`` is not ``noeviction``, naming each."""
    risky: dict[str, list[str]] = {}
    for server, policy in policies:
        if policy != SAFE_POLICY:
            risky.setdefault(policy, []).append(server)
    if not risky:
        return []
    named = "; ".join(
        f"maxmemory-policy {policy!r} ({', '.join(servers)})" for policy, servers in risky.items()
    )
    return [
        checks.Warning(
            f"The lock's Redis may evict a live lease: {named}.",
            hint=EVICTION_HINT,
            id=EVICTION_ID,
        )
    ]


#: The W002 texts logged at first use in this process (a forked child inherits them).
_logged: set[str] = set()


def warn_at_first_use(client: Any) -> threading.Thread:
    """Log W002 (once per process and text) when ``client``'s Redis may evict a lease.

    Called when a backend first makes its connection, so that a process that
    never runs ``manage.py check --deploy`` says it too. The ``CONFIG GET``
    runs on a daemon thread of its own, returned (and ended once answered):
    the call that made the connection never waits for it, so a Redis that
    stops answering costs that call one socket timeout, not two (on a cluster,
    not one more per node). Nothing here can fail that call: a server that
    cannot be asked (refused, unreachable) says nothing.
    """
    thread = threading.Thread(
        target=_warn, args=(client,), name="django-tasklock-redis-policy", daemon=True
    )
    thread.start()
    return thread


def _warn(client: Any) -> None:
    try:
        found = eviction_warnings(read_policies(client))
    except Exception:
        logger.debug("The lock's Redis maxmemory-policy could not be read.", exc_info=True)
        return
    for warning in found:
        if warning.msg not in _logged:
            _logged.add(warning.msg)
            logger.warning("%s %s (%s)", warning.msg, warning.hint, warning.id)


def _policy(client: Any) -> str | None:
    reply = client.config_get("maxmemory-policy")
    value = reply.get("maxmemory-policy", reply.get(b"maxmemory-policy"))
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value or None


def _server(client: Any) -> str:
    """Which server a plain client speaks to, for the message: ``host:port``, a socket."""
    pool = client.connection_pool
    service = getattr(pool, "service_name", None)
    if service:  # through Sentinel
        return f"the master of {service}"
    options = pool.connection_kwargs
    if options.get("path"):
        return str(options["path"])
    return f"{options.get('host', 'localhost')}:{options.get('port', 6379)}"


def location(client: Any) -> str:
    """Where ``client`` keeps the leases, for people: server and database, never a password.

    ``127.0.0.1:6379, db 0``; ``the master of mymaster, db 2`` through Sentinel;
    a socket's path; ``Redis Cluster (127.0.0.1:7000, ...)`` for a cluster.
    """
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        nodes = sorted(node.name for node in client.get_primaries())  # type: ignore[no-untyped-call]
        return f"Redis Cluster ({', '.join(nodes)})"
    db = client.connection_pool.connection_kwargs.get("db", 0)
    return f"{_server(client)}, db {db}"
