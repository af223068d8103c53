"""Redis: a release tells the waiting processes on a shard channel named as the key.

The scripts that free a key (release, force release, reap, clear) end with
``SPUBLISH <key>`` (``scripts``: ``signal``): a shard channel hashes to the
slot of the key of the same name, so the signal stays on the lease's own
node in a Cluster and is never broadcast to every node, as classic
``PUBLISH`` is. Nobody subscribed, it costs the server a dictionary lookup.

Each process with a waiter keeps one ``SSUBSCRIBE`` connection
(:class:`RedisListener`, see ``backends.listening``), subscribed to the keys
its waiters watch. A key's watch is ready once the server confirmed its
subscription. Before Redis 7.0 there is no shard channel: the listener finds
its first subscription refused (as it is for an ACL user without channel
permissions, and with redis-py before 5.0, which cannot ask) and reports the
storage deaf, and waiters poll. Channels are the server's, not a
database's: a release of the same key in another database of the server
wakes a waiter for one look in vain.

Not on a Redis Cluster client yet: there each node's subscriptions need a
connection of their own, and waiters poll.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django_tasklock.backends.listening import Listener

if TYPE_CHECKING:
    import redis

#: Seconds the listener waits for its first subscription's confirmation.
CONFIRM_WAIT = 5.0


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


class RedisListener(Listener):
    """The process's ``SSUBSCRIBE`` connection to one Redis server (or Sentinel's master)."""

    ready_on_add = False

    def __init__(self, client: redis.Redis, name: str) -> None:
        super().__init__(f"redis:{name}")
        self._client = client
        self._pubsub: Any = None
        self._heard: list[str] = []

    def _forget(self) -> None:
        super()._forget()
        self._pubsub = None  # the parent's connection: left to the parent

    def connect(self) -> bool:
        from redis.exceptions import ResponseError

        pubsub = self._pubsub = self._client.pubsub()
        if not hasattr(pubsub, "ssubscribe"):  # redis-py before 5.0
            self.close()
            return False
        # A channel of this listener alone: the connection exists from now on,
        # and its confirmation says that this server has shard channels.
        own = f"tasklock-listener:{uuid.uuid4().hex}"
        try:
            pubsub.ssubscribe(own)
            deadline = time.monotonic() + CONFIRM_WAIT
            while True:
                left = deadline - time.monotonic()
                if left <= 0:  # slow, not refused: tried again soon
                    raise TimeoutError(f"no confirmation of SSUBSCRIBE in {CONFIRM_WAIT:g} s")
                message = pubsub.get_message(timeout=left)
                confirmed = message and message["type"] == "ssubscribe"
                if confirmed and _text(message["channel"]) == own:
                    return True
        except ResponseError:  # refused: Redis before 7.0, or an ACL without channels
            self.close()
            return False

    def add(self, stored: Iterable[str]) -> None:
        self._pubsub.ssubscribe(*stored)

    def drop(self, stored: Iterable[str]) -> None:
        self._pubsub.sunsubscribe(*stored)

    def fileno(self) -> int:
        # redis-py keeps the socket private; it has been ``_sock`` for a decade.
        return int(self._pubsub.connection._sock.fileno())

    def read(self) -> Iterable[str]:
        heard: list[str] = []
        while (message := self._pubsub.get_message(timeout=0)) is not None:
            kind, channel = message["type"], _text(message["channel"])
            if kind == "smessage":
                heard.append(channel)
            elif kind == "ssubscribe":
                self.confirmed(channel)
        return heard

    def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            pubsub.close()
