"""One script call sent on a plain client's pooled connection, without redis-py's command layers.

A lock cycle on Redis is two ``EVALSHA`` calls. Through ``execute_command``,
redis-py packs every argument with its generic encoder, records its own
observability, looks for ``HIMPORT`` and wraps the exchange in its retry
loop: about a sixth of the cycle's CPU, and more than all of the lock's own
bookkeeping. :class:`Lean` packs the ``EVALSHA`` itself (its fixed head
built once per script and key count) and sends it as ``execute_command``
would: on a connection checked out of the client's own pool and returned to
it, with the connection's own health checks, reconnects and errors, and its
own ``Retry`` (a client made from a URL has none; a ``redis.Redis(...)`` built
by hand retries a timed-out command, and still does here).

It stands aside, and the client's ``evalsha`` is used, wherever it could not
speak for the client exactly: a cluster; a redis-py older than 5.3; a client
class or connection class that overrides any step of the path it skips
(``execute_command`` down to ``parse_response``; ``send_command``,
``pack_command``); an ``execute_command`` wrapped, on the class or on the
client (OpenTelemetry's ``RedisInstrumentor().instrument()`` and
``instrument_client()``: their spans stay); a response callback for
``EVALSHA``; redis-py's own observability turned on; a single-connection
client, client-side caching, or an encoding other than strict UTF-8. What
can change while the client is in use (a wrapper, a callback, the
observability) is looked at on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

_MIN_REDIS = (5, 3)  # get_connection() without arguments; Retry.get_retries()


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _observing() -> Callable[[], bool]:
    """Whether redis-py's own observability is on (it records every command)."""
    try:
        from redis.observability.providers import get_observability_instance
    except ImportError:  # redis-py without it
        return lambda: False
    return lambda: get_observability_instance().get_provider_manager() is not None


#: The client's steps from ``execute_command`` to the reply, which the lean call skips.
_SKIPPED_CLIENT = (
    "execute_command",
    "_execute_command",
    "_send_command_parse_response",
    "parse_response",
)
#: The connection's packing, which the lean call does itself.
_SKIPPED_CONN = ("send_command", "pack_command")


def _own(cls: type, name: str, module: str) -> bool:
    """Whether ``cls.name`` is redis-py's own (from ``module``), not overridden nor wrapped."""
    method = getattr(cls, name, None)
    return (
        method is not None
        and not hasattr(method, "__wrapped__")
        and getattr(method, "__module__", "").startswith(module)
    )


def _arg(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    raise TypeError(f"a script argument must be bytes, str or int, not {type(value).__name__}")


class Lean:
    """``EVALSHA`` on ``client``'s pool, packed here; made by :meth:`of` (None where it can't)."""

    def __init__(self, client: Any, execute_command: Any) -> None:
        self.client = client
        self._pool = client.connection_pool
        self._execute_command = execute_command
        self._observing = _observing()

    @classmethod
    def of(cls, client: Any) -> Lean | None:
        """A Lean for a plain ``redis.Redis`` it can speak for exactly, else None."""
        import redis

        if not isinstance(client, redis.Redis) or _version(redis.__version__) < _MIN_REDIS:
            return None
        plain = type(client).execute_command
        pool = client.connection_pool
        options = pool.connection_kwargs
        if (
            not all(_own(type(client), name, "redis.client") for name in _SKIPPED_CLIENT)
            or not all(_own(pool.connection_class, name, "redis.") for name in _SKIPPED_CONN)
            or getattr(client, "connection", None) is not None  # single_connection_client
            or getattr(pool, "cache", None) is not None  # client-side caching
            or str(options.get("encoding", "utf-8")).lower() not in ("utf-8", "utf8")
            or options.get("encoding_errors", "strict") != "strict"
        ):
            return None
        return cls(client, plain)

    def usable(self) -> bool:
        """Nothing since wraps ``execute_command`` (on the class or the client), no
        ``EVALSHA`` callback, redis-py's observability off: looked at on every call."""
        client = self.client
        return (
            type(client).execute_command is self._execute_command
            and "execute_command" not in client.__dict__
            and "EVALSHA" not in client.response_callbacks
            and not self._observing()
        )

    def evalsha(self, sha: bytes, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """``EVALSHA sha len(keys) *keys *args``: the reply or error ``evalsha`` would give."""
        packed = [pack(sha, keys, args)]
        pool = self._pool
        conn = pool.get_connection()
        try:
            retry = conn.retry
            if retry.get_retries():
                return retry.call_with_retry(
                    lambda: self._exchange(conn, packed), lambda _error: conn.disconnect()
                )
            return self._exchange(conn, packed)
        finally:
            pool.release(conn)

    def evalsha_many(self, packed: Sequence[bytes]) -> list[Any]:
        """Several packed ``EVALSHA`` calls (:meth:`pack`) sent at once on one connection.

        One reply each, in order; a reply that is an error (``NOSCRIPT``...) is
        that error, in its place, as a pipeline's ``raise_on_error=False``
        gives it. A connection error fails the whole call (retried as
        :meth:`evalsha` is, with the client's ``Retry``).
        """
        pool = self._pool
        conn = pool.get_connection()
        try:
            retry = conn.retry
            if retry.get_retries():
                return retry.call_with_retry(  # type: ignore[no-any-return]
                    lambda: self._exchange_many(conn, packed), lambda _error: conn.disconnect()
                )
            return self._exchange_many(conn, packed)
        finally:
            pool.release(conn)

    def pack(self, sha: bytes, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        """The bytes of ``EVALSHA sha len(keys) *keys *args`` on the wire (:func:`pack`)."""
        return pack(sha, keys, args)

    @staticmethod
    def _exchange(conn: Any, packed: list[bytes]) -> Any:
        try:
            conn.send_packed_command(packed)
            return conn.read_response()
        except BaseException:
            # Interrupted once sent, before the reply was read (a KeyboardInterrupt): the
            # reply may still come; never back to the pool with it unread.
            conn.disconnect()
            raise

    @staticmethod
    def _exchange_many(conn: Any, packed: Sequence[bytes]) -> list[Any]:
        from redis.exceptions import ResponseError

        try:
            conn.send_packed_command(list(packed))
            replies: list[Any] = []
            for _ in packed:
                try:
                    replies.append(conn.read_response())
                except ResponseError as error:  # this call's reply: the stream is still in step
                    replies.append(error)
            return replies
        except BaseException:
            conn.disconnect()  # replies may be left unread: never back to the pool so
            raise


#: The fixed start of an ``EVALSHA``, per script, key count and argument count.
_heads: dict[tuple[bytes, int, int], bytes] = {}


def pack(sha: bytes, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
    """The bytes of ``EVALSHA sha len(keys) *keys *args`` on the wire, as redis-py packs them."""
    count = len(keys)
    head = _heads.get((sha, count, len(args)))
    if head is None:
        head = _head(sha, count, len(args))
    parts = [head]
    for value in (*keys, *args):
        kind = type(value)  # exact types first: this runs a few times per call
        if kind is str:
            data = value.encode()
        elif kind is bytes:
            data = value
        elif kind is int:
            data = b"%d" % value
        else:
            data = _arg(value)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _head(sha: bytes, keys: int, args: int) -> bytes:
    numkeys = b"%d" % keys
    head = b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        3 + keys + args,
        len(sha),
        sha,
        len(numkeys),
        numkeys,
    )
    if len(_heads) < 64:  # a few scripts, a few key counts; refresh_many varies
        _heads[sha, keys, args] = head
    return head
