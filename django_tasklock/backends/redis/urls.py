"""Redis clients from ``TASKLOCK_REDIS_URL``: a plain Redis URL, Sentinel, or Redis Cluster.

:func:`parse_url` reads every form the setting takes and is the one judge of
a URL, for ``manage.py check`` (E009) and for first use alike; it needs no
redis-py and connects to nothing. :func:`client_from_url` makes the client.

``redis+sentinel://[[username]:password@]host:port[,host:port...]/service_name[/db]``
asks those sentinels for the master of ``service_name`` and follows it across
failovers (redis-py's ``Sentinel.master_for``); the username and password are
the master's.
``redis+cluster://[[username]:password@]host:port[,host:port...]`` makes
redis-py's ``RedisCluster``, which learns the cluster's layout from any of
those nodes and follows ``MOVED`` and ``ASK`` (a cluster has database 0 only).
Every client gets 10 s socket timeouts and no retries (the
sentinels' clients too), so that a Redis that stops answering stalls the
heartbeat for one timeout per call; the query string's options win over
the timeouts. A query option is honoured or the URL is rejected,
never silently ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

SETTING = "TASKLOCK_REDIS_URL"
SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME, CLUSTER_SCHEME)
TIMEOUT_S = 10
#: The accepted forms, for messages and the check's hint.
FORMS = (
    "redis://[[username]:password@]host[:port][/db], rediss://... (TLS), "
    "unix://[[username]:password@]/path/to/socket[?db=N], "
    f"{SENTINEL_SCHEME}://[[username]:password@]host:port[,host:port...]/service_name[/db] or "
    f"{CLUSTER_SCHEME}://[[username]:password@]host:port[,host:port...]"
)

_DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() is True for "²", which int() rejects


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError("true or false")


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError("a number of seconds above 0")
    return seconds


def _count(value: str) -> int:
    if not _DIGITS.fullmatch(value):
        raise ValueError("a whole number")
    return int(value)


def _cert_reqs(value: str) -> str:
    if value not in ("none", "optional", "required"):
        raise ValueError("none, optional or required")
    return value


def _text(value: str) -> str:
    if not value:
        raise ValueError("not empty")
    return value


#: The query options a URL may carry; each is a redis-py client argument.
OPTIONS: dict[str, Callable[[str], Any]] = {
    "db": _count,
    "socket_timeout": _seconds,
    "socket_connect_timeout": _seconds,
    "socket_keepalive": _bool,
    "health_check_interval": _count,
    "max_connections": _count,
    "client_name": _text,
    "ssl": _bool,
    "ssl_cert_reqs": _cert_reqs,
    "ssl_ca_certs": _text,
    "ssl_certfile": _text,
    "ssl_keyfile": _text,
    "ssl_check_hostname": _bool,
}
#: What a Sentinel URL gives the sentinels as well as the master: how to reach a server.
SENTINEL_SHARED = frozenset(name for name in OPTIONS if name.startswith(("socket_", "ssl")))


class RedisURLError(ImproperlyConfigured):
    """A ``TASKLOCK_REDIS_URL`` that does not read; ``problem`` says why, without the forms."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting}: {problem}. It takes {FORMS}.")
        self.setting = setting
        self.problem = problem


@dataclass(frozen=True)
class RedisURL:
    """A parsed ``TASKLOCK_REDIS_URL``; ``hosts`` are the sentinels for Sentinel,
    the nodes to start from for Cluster."""

    scheme: str
    hosts: tuple[tuple[str, int], ...] = ()
    socket_path: str = ""
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def parse_url(url: object, setting: str = SETTING) -> RedisURL:
    """Read a Redis URL, or raise :class:`RedisURLError` naming ``setting`` and the fault.

    The message never repeats the password.
    """

    def bad(problem: str) -> RedisURLError:
        return RedisURLError(setting, problem)

    if not isinstance(url, str):
        raise bad(f"expected a string, got {type(url).__name__}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower() if "://" in url else ""
    if scheme not in SCHEMES:
        shown = f"{scheme}://" if scheme else "no scheme"
        raise bad(f"{shown} is not a Redis URL scheme")
    userinfo, _, location = parts.netloc.rpartition("@")
    username, password = _credentials(userinfo)
    options = _options(parts.query, bad)
    path = [unquote(piece) for piece in parts.path.split("/") if piece]
    if scheme == "unix":
        if location or not path:
            raise bad("a unix:// URL names a socket path, as unix:///path/to/socket")
        if any(name.startswith("ssl") for name in options):
            raise bad("a unix socket takes no ssl options")
        return RedisURL(
            scheme,
            socket_path="/" + "/".join(path),
            db=options.pop("db", 0),
            username=username,
            password=password,
            options=options,
        )
    items = location.split(",")
    several = (SENTINEL_SCHEME, CLUSTER_SCHEME)
    if scheme not in several and len(items) > 1:
        raise bad(
            f"{scheme}:// names one server; several are for {SENTINEL_SCHEME}:// "
            f"or {CLUSTER_SCHEME}://"
        )
    hosts = tuple(_host_port(item, scheme == "redis" or scheme == "rediss", bad) for item in items)
    if scheme == CLUSTER_SCHEME:
        if path or "db" in options:
            raise bad(f"a {CLUSTER_SCHEME}:// URL names no database: a cluster has only 0")
        return RedisURL(scheme, hosts, username=username, password=password, options=options)
    service = ""
    if scheme == SENTINEL_SCHEME:
        if not path:
            raise bad(f"a {SENTINEL_SCHEME}:// URL names the service after the sentinels")
        service, path = path[0], path[1:]
    if len(path) > 1 or (path and not _DIGITS.fullmatch(path[0])):
        raise bad(f"the database {'/'.join(path)!r} is not a whole number")
    if path and "db" in options:
        raise bad("the database is given twice, in the path and as ?db=")
    db = int(path[0]) if path else options.pop("db", 0)
    if scheme == "rediss" and options.get("ssl") is False:
        raise bad("rediss:// is TLS: ?ssl=false contradicts it")
    return RedisURL(scheme, hosts, "", service, db, username, password, options)


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    if not userinfo:
        return None, None
    username, colon, password = userinfo.partition(":")
    return unquote(username) or None, unquote(password) if colon else None


def _host_port(
    item: str, port_optional: bool, bad: Callable[[str], RedisURLError]
) -> tuple[str, int]:
    if item.startswith("["):  # an IPv6 address, [::1]:6379
        host, _, rest = item[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise bad(f"{item!r} is not host:port")
        port = rest[1:] if rest else None
    else:
        host, colon, port_text = item.rpartition(":")
        host, port = (host, port_text) if colon else (item, None)
    if not host:
        raise bad(f"{item!r} names no host" if item else "the URL names no host")
    if port is None:
        if port_optional:
            return host, 6379
        raise bad(f"{item!r} names no port")
    if not _DIGITS.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise bad(f"the port {port!r} of {host!r} is not a number from 1 to 65535")
    return host, int(port)


def _options(query: str, bad: Callable[[str], RedisURLError]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in OPTIONS:
            raise bad(f"the option {name!r} is not one it takes ({', '.join(OPTIONS)})")
        if name in options:
            raise bad(f"the option {name!r} is given twice")
        try:
            options[name] = OPTIONS[name](value)
        except ValueError as exc:
            raise bad(f"the option {name}={value!r} is not {exc}") from None
    return options


def client_from_url(url: str, setting: str = SETTING) -> redis.Redis | RedisCluster:
    """A redis-py client for ``url`` (see :func:`parse_url`).

    It connects on first command; a ``RedisCluster`` asks a node for the
    cluster's layout as it is made.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    parsed = parse_url(url, setting)
    # No retries, as redis-py's from_url gave (redis-py 8's Redis() retries 10
    # times): a Redis that stops answering costs one socket timeout per call.
    options: dict[str, Any] = {
        "socket_timeout": TIMEOUT_S,
        "socket_connect_timeout": TIMEOUT_S,
        "retry": Retry(NoBackoff(), 0),
    }
    options.update(parsed.options)
    if parsed.scheme == CLUSTER_SCHEME:
        return _cluster_client(parsed, options)
    auth: dict[str, Any] = {
        "db": parsed.db,
        "username": parsed.username,
        "password": parsed.password,
    }
    if parsed.scheme == "unix":
        return redis.Redis(unix_socket_path=parsed.socket_path, **auth, **options)
    if parsed.scheme != SENTINEL_SCHEME:
        if parsed.scheme == "rediss":
            options["ssl"] = True
        (host, port), *_ = parsed.hosts
        return redis.Redis(host, port, **auth, **options)
    from redis.sentinel import Sentinel

    shared = {
        name: value
        for name, value in options.items()
        if name in SENTINEL_SHARED or name == "retry"
    }
    sentinel = Sentinel(list(parsed.hosts), sentinel_kwargs=shared)  # type: ignore[no-untyped-call, unused-ignore]
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        parsed.service, **auth, **options
    )
    return client


def _cluster_client(parsed: RedisURL, options: dict[str, Any]) -> RedisCluster:
    from redis.cluster import ClusterNode, RedisCluster

    nodes = [ClusterNode(host, port) for host, port in parsed.hosts]  # type: ignore[no-untyped-call]
    return RedisCluster(
        startup_nodes=nodes, username=parsed.username, password=parsed.password, **options
    )
