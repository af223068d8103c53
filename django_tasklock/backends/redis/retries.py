"""How long one command may go on being sent by a redis-py client: its retry window.

redis-py re-sends a command that timed out (or whose connection broke) on a
new connection, up to its ``Retry``'s count, waiting the backoff between. The
first copy may still reach Redis late, after the re-send ran. A release leaves
a tombstone naming its token for that long (never less than 60 s), so that a
copy of it arriving within the window is recognised as this release sent
again, and a copy of an acquisition arriving after the release writes nothing.
"""

from __future__ import annotations

from typing import Any

#: The tombstone's floor, and its length for a client whose window is unknown.
FLOOR_MS = 60_000


def retry_window_ms(client: Any) -> int:
    """The tombstone lifetime for ``client``: its retry window, at least :data:`FLOOR_MS`.

    (retries + 1) x (socket timeout + connect timeout) + retries x the
    backoff's cap. A client without a socket timeout may wait forever on one
    copy: no window is known, the floor applies (give it a ``socket_timeout``).
    """
    kwargs = _connection_kwargs(client)
    timeout = kwargs.get("socket_timeout")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        return FLOOR_MS
    connect = kwargs.get("socket_connect_timeout")
    if not isinstance(connect, (int, float)) or connect <= 0:
        connect = timeout  # redis-py's own default for it
    retry = _retry_of(client, kwargs)
    retries = getattr(retry, "_retries", 0) if retry is not None else 0
    retries = retries if isinstance(retries, int) and retries > 0 else 0
    cap = getattr(getattr(retry, "_backoff", None), "_cap", 1.0)
    cap = cap if isinstance(cap, (int, float)) and cap >= 0 else 1.0
    window = (retries + 1) * (timeout + connect) + retries * cap
    return max(FLOOR_MS, int(window * 1000))


def _connection_kwargs(client: Any) -> dict[str, Any]:
    """The keyword arguments the client's connections are made with."""
    nodes = getattr(client, "nodes_manager", None)  # a RedisCluster
    if nodes is not None:
        kwargs = getattr(nodes, "connection_kwargs", None)
    else:
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    return kwargs if isinstance(kwargs, dict) else {}


def _retry_of(client: Any, kwargs: dict[str, Any]) -> Any:
    get_retry = getattr(client, "get_retry", None)
    retry = get_retry() if callable(get_retry) else getattr(client, "retry", None)  # cluster
    return retry if retry is not None else kwargs.get("retry")
