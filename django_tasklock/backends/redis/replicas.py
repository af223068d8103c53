"""Replica acknowledgement: ``WAIT`` after the write that grants a lease or a fence.

Redis replicates asynchronously: a master that dies right after granting a
lease may never have sent it to the replica that a failover promotes, which
then grants the key again. With ``min_replicas`` set, every acquisition (and
fence) is followed by ``WAIT min_replicas timeout_ms``; a grant that fewer
replicas confirmed in time is released by its token and fails with
:class:`~django_tasklock.exceptions.ReplicationNotConfirmed`.

``WAIT`` counts the writes of the connection it is sent on, so it must follow
the script on the same connection: both go in one pipeline, which is one
connection. On a ``RedisCluster`` the pair goes in a plain pipeline on the
connection of the node that owns the key (redis-py's cluster pipeline would
follow a redirect on another connection, leaving the ``WAIT`` to count
writes made elsewhere): a script answered ``MOVED`` or ``ASK`` (its slot
moved, or is being migrated) is sent again with its ``WAIT`` to the node named,
``ASKING`` first for an ``ASK``; ``TRYAGAIN`` is sent again after a pause.
redis-py is imported only when a pipeline is sent.
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
    """Run the script ``name`` on ``keys``, then ``WAIT`` on its connection.

    Returns the script's reply and the number of replicas that confirmed.

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
        pipe = (client if node is None else client.get_redis_connection(node)).pipeline(
            transaction=False
        )
        if asking:  # the slot is being migrated to this node: this once, it runs the script
            pipe.execute_command("ASKING")
        pipe.execute_command("EVALSHA", scripts.shas[name], len(keys), *keys, *args)
        pipe.execute_command("WAIT", ack.count, ack.timeout_ms)
        try:
            *_, reply, acked = pipe.execute(raise_on_error=False)
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
        for answer in (reply, acked):
            if isinstance(answer, Exception):
                raise answer
        return reply, int(acked)
    raise AssertionError("unreachable")  # pragma: no cover


def _unknown(redirect: Exception) -> Any:
    """A redirect to a node the client does not know: raised (the lock then releases)."""
    raise redirect


def unconfirmed(
    release: Callable[[], object], key: str, ack: ReplicaAck, confirmed: int
) -> ReplicationNotConfirmed:
    """Release a grant too few replicas confirmed (by its token); the error to raise.

    A release that fails (its reply lost, Redis gone) leaves the lease to
    expire after its ``ttl``; the error says so. A release sent twice ends
    nothing more: it is bound to the token.
    """
    try:
        release()
    except Exception:
        logger.warning("Releasing the unconfirmed lease of %r failed.", key, exc_info=True)
        released = False
    else:
        released = True
    return ReplicationNotConfirmed(key, ack.count, confirmed, ack.timeout, released)
