"""Replica acknowledgement: ``WAIT`` after the write that grants a lease or a fence.

Redis replicates asynchronously: a master that dies right after granting a
lease may never have sent it to the replica that a failover promotes, which
then grants the key again. With ``min_replicas`` set, every acquisition (and
fence) is followed by ``WAIT min_replicas timeout_ms``; a grant that fewer
replicas confirmed in time is released by its token and fails with
:class:`~django_tasklock.exceptions.ReplicationNotConfirmed`. So is a "run
once more" mark written (``mark_rerun``), whose loss would be one run less:
one too few replicas confirmed is left as written and fails with
:class:`MarkNotConfirmed`.

``WAIT`` counts the writes of the connection it is sent on, so it must follow
the script on the same connection: both are sent on one connection taken
from the client's pool, the ``WAIT`` only once the script has granted. A
refusal (the key held: reply 0 or its holder's token; no fence: nil) wrote nothing, and its
``WAIT`` would only have waited, the whole timeout while a replica is down,
for nothing; a grant costs one round trip to the master more than a
pipeline of the two would. An ``acquire`` sent again that finds its own
lease answers 1 (and writes it again), so its ``WAIT`` is sent too.
On a ``RedisCluster`` that connection is one of the node that owns the key
(redis-py's cluster client would follow a redirect on another connection,
leaving the ``WAIT`` to count writes made elsewhere): a script answered
``MOVED`` or ``ASK`` (its slot moved, or is being migrated) is sent again to
the node named, ``ASKING`` first for an ``ASK``; ``TRYAGAIN`` is sent again
after a pause. redis-py is imported only when a script is sent.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from django_tasklock.durations import to_timedelta
from django_tasklock.exceptions import ReplicationNotConfirmed

if TYPE_CHECKING:
    from django_tasklock.backends.redis.calls import Scripts

MIN_REPLICAS_SETTING = "TASKLOCK_REDIS_MIN_REPLICAS"
TIMEOUT_SETTING = "TASKLOCK_REDIS_REPLICA_TIMEOUT"
DEFAULT_TIMEOUT = timedelta(seconds=1)
#: Sends of the script and its ``WAIT``: the script loaded again, or redirected on a cluster.
_ATTEMPTS = 6
_TRYAGAIN_PAUSE = 0.05

logger = logging.getLogger("django_tasklock")


@dataclass(frozen=True)
class ReplicaAck:
    """How many replicas must confirm a grant (``count`` >= 1), and within what."""

    count: int
    timeout: timedelta

    @property
    def timeout_ms(self) -> int:
        return max(1, math.ceil(self.timeout / timedelta(milliseconds=1)))


def replica_ack(
    min_replicas: object,
    timeout: object,
    names: tuple[str, str] = ("min_replicas", "replica_timeout"),
) -> ReplicaAck | None:
    """The acknowledgement asked for, or None for none (``min_replicas`` 0).

    ``min_replicas`` is a whole number from 0; ``timeout`` seconds (int or
    float) or a timedelta, 1 ms to 24 h. ``TypeError``/``ValueError`` naming
    the one of ``names`` at fault.
    """
    count_name, timeout_name = names
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int):
        raise TypeError(f"{count_name} must be a whole number of replicas, not {min_replicas!r}")
    if min_replicas < 0:
        raise ValueError(
            f"{count_name} must be 0 (no acknowledgement) or more, got {min_replicas}"
        )
    duration = to_timedelta(timeout_name, timeout)
    return ReplicaAck(min_replicas, duration) if min_replicas else None


def ack_from_settings() -> ReplicaAck | None:
    """:func:`replica_ack` of the settings; ``ImproperlyConfigured`` naming the setting."""
    from django_tasklock.conf import conf

    try:
        return replica_ack(
            conf.REDIS_MIN_REPLICAS,
            conf.REDIS_REPLICA_TIMEOUT,
            (MIN_REPLICAS_SETTING, TIMEOUT_SETTING),
        )
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(str(exc)) from None


def send_and_wait(
    scripts: Scripts, name: str, keys: list[str], args: Sequence[Any], ack: ReplicaAck
) -> tuple[Any, int]:
    """Run the script ``name`` on ``keys``, then, if it granted, ``WAIT`` on its connection.

    Returns the script's reply and the number of replicas that confirmed (0
    for a refusal, for which nothing was waited for).

    A script the server does not have (a restart, a failover) is loaded and
    sent again; on a cluster, so is one redirected (see the module's
    docstring): ``acquire`` sent again finds its own lease (and writes it
    again, which the ``WAIT`` then covers); ``fence`` hands out a greater fence.
    """
    from redis.exceptions import (
        AskError,
        ConnectionError,
        MovedError,
        NoScriptError,
        TimeoutError,
        TryAgainError,
    )

    client = scripts.client
    node = client.get_node_from_key(keys[0]) if scripts.cluster else None
    asking = False
    for attempt in range(1, _ATTEMPTS + 1):
        target = client if node is None else client.get_redis_connection(node)
        try:
            reply, acked = _script_then_wait(target, asking, scripts.shas[name], keys, args, ack)
        except (ConnectionError, TimeoutError):
            if node is not None:  # a master gone: learn the layout again for the next call
                client.nodes_manager.initialize()
            raise  # the lock releases the lease by its token (fail closed)
        if attempt < _ATTEMPTS:
            if isinstance(reply, NoScriptError):
                scripts.load()
                continue
            if node is not None and isinstance(reply, (MovedError, AskError)):
                if isinstance(reply, MovedError):
                    client.nodes_manager.initialize()  # the slot map, learnt again
                asking = isinstance(reply, AskError)
                node = client.get_node(host=reply.host, port=reply.port) or _unknown(reply)
                continue
            if node is not None and isinstance(reply, TryAgainError):
                time.sleep(_TRYAGAIN_PAUSE)  # the slot's keys split: the same node, ASKING again
                continue
        if isinstance(reply, Exception):
            raise reply
        return reply, acked
    raise AssertionError("unreachable")  # pragma: no cover


def _script_then_wait(
    target: Any, asking: bool, sha: str, keys: list[str], args: Sequence[Any], ack: ReplicaAck
) -> tuple[Any, int]:
    """On one connection of ``target``'s pool: the script, then, if it granted, ``WAIT``.

    Returns the script's reply (an error it answered, as the exception) and
    the replicas that confirmed (0 when no ``WAIT`` was sent). A connection
    that breaks has the whole pair sent again, as a pipeline would (by the
    connection's retry policy: none for a client made from a URL), never the
    ``WAIT`` alone on a connection that wrote nothing.
    """
    from redis.exceptions import ResponseError

    pool = target.connection_pool
    try:
        conn = pool.get_connection()
    except TypeError:  # redis-py before 5.3 asks for a command name
        conn = pool.get_connection("EVALSHA")

    def pair() -> tuple[Any, int]:
        if asking:  # the slot is being migrated to this node: this once, it runs the script
            conn.send_command("ASKING")
            conn.read_response()
        conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
        try:
            reply = conn.read_response()
        except ResponseError as error:  # NOSCRIPT, a redirect, OOM: the caller judges
            return error, 0
        if not (isinstance(reply, int) and reply > 0):
            # Refused (0, the holder's token, a permit's {"limit", N} or
            # {"mine", ...}), or no fence (nil): nothing written to wait for.
            return reply, 0
        conn.send_command("WAIT", ack.count, ack.timeout_ms)
        return reply, int(conn.read_response())

    try:
        return conn.retry.call_with_retry(pair, lambda _error: conn.disconnect())  # type: ignore[no-any-return]
    except BaseException:
        conn.disconnect()  # a reply may be left unread: never back to the pool as it is
        raise
    finally:
        pool.release(conn)


def _unknown(redirect: Exception) -> Any:
    """A redirect to a node the client does not know: raised (the lock then releases)."""
    raise redirect


class MarkNotConfirmed(ReplicationNotConfirmed):
    """A "run once more" mark (``mark_rerun``) written, but confirmed by fewer replicas
    than asked within the timeout: it stays, and a failover may lose it (``released``
    is False: nothing was undone). Its message says so, not "not acquired"."""

    def __init__(
        self, key: str, wanted: int, confirmed: int, timeout: timedelta, released: bool = False
    ) -> None:
        super().__init__(key, wanted, confirmed, timeout, released)
        self.args = (
            f"The rerun mark of task lock {key!r} was written, but {confirmed} of the "
            f"{wanted} replica(s) asked for (TASKLOCK_REDIS_MIN_REPLICAS) confirmed it "
            f"within {timeout}: a failover may lose it.",
        )


def mark_unconfirmed(key: str, ack: ReplicaAck, confirmed: int) -> MarkNotConfirmed:
    """The error for a mark too few replicas confirmed (the mark is left as written)."""
    return MarkNotConfirmed(key, ack.count, confirmed, ack.timeout)


def unconfirmed(
    release: Callable[[], object], key: str, ack: ReplicaAck, confirmed: int
) -> ReplicationNotConfirmed:
    """Release a grant too few replicas confirmed (by its token); the error to raise.

    A release that fails (its reply lost, Redis gone) leaves the lease to
    expire after its ``ttl``, and one that finds it no longer there (it ran
    out during the ``WAIT``) ended nothing: either way ``released`` is False
    and the error says so. A release sent twice ends nothing more: it is
    bound to the token.
    """
    try:
        released = bool(release())
    except Exception:
        logger.warning("Releasing the unconfirmed lease of %r failed.", key, exc_info=True)
        released = False
    return ReplicationNotConfirmed(key, ack.count, confirmed, ack.timeout, released)
