"""Redis clients from ``TASKLOCK_REDIS_URL``: a plain Redis URL, or Sentinel.

``redis://``, ``rediss://`` and ``unix://`` URLs go to redis-py's ``from_url``.
``redis+sentinel://[:password@]host:port[,host:port...]/service_name[/db]``
asks those sentinels for the master of ``service_name`` and follows it across
failovers (redis-py's ``Sentinel.master_for``). Either way the client gets
socket timeouts, so that a Redis that stops answering cannot stall the
heartbeat for ever; options in a plain URL's query string win over them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    import redis

SENTINEL_SCHEME = "redis+sentinel"
TIMEOUT_S = 10


def client_from_url(url: str) -> redis.Redis:
    import redis

    if not url.startswith(SENTINEL_SCHEME + "://"):
        return redis.Redis.from_url(
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
        )
    from redis.sentinel import Sentinel

    parts = urlsplit(url)
    hosts = [_host_port(item) for item in parts.netloc.rpartition("@")[2].split(",") if item]
    path = [unquote(piece) for piece in parts.path.split("/") if piece]
    if not hosts or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ImproperlyConfigured(
            f"TASKLOCK_REDIS_URL {SENTINEL_SCHEME}:// URLs read "
            f"'{SENTINEL_SCHEME}://[:password@]host:port[,host:port]/service_name[/db]'."
        )
    timeouts = {"socket_timeout": TIMEOUT_S, "socket_connect_timeout": TIMEOUT_S}
    sentinel = Sentinel(hosts, sentinel_kwargs=timeouts, **timeouts)  # type: ignore[no-untyped-call]
    password = unquote(parts.password) if parts.password else None
    db = int(path[1]) if len(path) == 2 else 0
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        path[0], db=db, password=password
    )
    return client


def _host_port(item: str) -> tuple[str, int]:
    host, _, port = item.rpartition(":")
    if not host or not port.isdigit():
        raise ImproperlyConfigured(f"TASKLOCK_REDIS_URL: {item!r} is not host:port")
    return host.strip("[]"), int(port)
