"""Running the backend's Lua scripts on a client: one at a time, or many in one pipeline.

Scripts are sent by SHA (``EVALSHA``). A server that does not know one
(restarted, ``SCRIPT FLUSH``, a replica promoted in a failover, a master
added to a cluster) answers ``NOSCRIPT``: every script is loaded again
(``SCRIPT LOAD``, which a ``RedisCluster`` sends to every master) and the
call is sent again. The same code serves ``redis.Redis`` and redis-py's
``RedisCluster``: every script's keys live in one hash slot (see ``slots``),
and redis-py follows ``MOVED``, ``ASK`` and ``TRYAGAIN`` itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from django_tasklock.backends.redis.scripts import PRELUDE, SCRIPTS

#: One script call: the script's name, its keys, its arguments.
Call = tuple[str, Sequence[Any], Sequence[Any]]


class Scripts:
    """The scripts of :data:`~django_tasklock.backends.redis.scripts.SCRIPTS` on ``client``."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.bodies = {name: PRELUDE + body for name, body in SCRIPTS.items()}
        self.shas = {
            name: hashlib.sha1(body.encode()).hexdigest() for name, body in self.bodies.items()
        }

    def load(self) -> None:
        """``SCRIPT LOAD`` every script (on a cluster: on every master)."""
        for body in self.bodies.values():
            self.client.script_load(body)

    def run(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        from redis.exceptions import NoScriptError  # imported by the client already

        try:
            return self.client.evalsha(self.shas[name], len(keys), *keys, *args)
        except NoScriptError:
            self.load()
            return self.client.evalsha(self.shas[name], len(keys), *keys, *args)

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Every call in one pipeline (not a transaction); the replies in order.

        Calls met with ``NOSCRIPT`` are sent again once the scripts are
        loaded; any other error is raised.
        """
        from redis.exceptions import NoScriptError

        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for index in todo:
                name, keys, args = calls[index]
                # execute_command: a cluster pipeline refuses its evalsha() method,
                # not the command (each call's keys share a slot).
                pipe.execute_command("EVALSHA", self.shas[name], len(keys), *keys, *args)
            answers = pipe.execute(raise_on_error=False)
            missing = []
            for index, answer in zip(todo, answers, strict=True):
                if isinstance(answer, NoScriptError) and attempt == 1:
                    missing.append(index)
                elif isinstance(answer, Exception):
                    raise answer
                else:
                    replies[index] = answer
            if not missing:
                break
            self.load()
            todo = missing
        return replies
