"""Running the backend's Lua scripts on a client: one at a time, or many in one pipeline.

Scripts are sent by SHA (``EVALSHA``). A server that does not know one
(restarted, ``SCRIPT FLUSH``, a replica promoted in a failover, a master
added to a cluster) answers ``NOSCRIPT``: every script is loaded again
(``SCRIPT LOAD``; on a cluster, on every master that answers) and the call
is sent again. The same code serves ``redis.Redis`` and redis-py's
``RedisCluster``: every script's keys live in one hash slot (see ``slots``),
and redis-py follows ``MOVED``, ``ASK`` and ``TRYAGAIN`` itself.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django_tasklock.backends.redis.lean import Lean, pack
from django_tasklock.backends.redis.retries import retry_window_ms
from django_tasklock.backends.redis.scripts import PRELUDE, SCRIPTS

#: One script call: the script's name, its keys, its arguments.
Call = tuple[str, Sequence[Any], Sequence[Any]]
#: Most leases one ``refresh_many`` script carries.
REFRESH_CHUNK = 500
#: The scripts of a heartbeat's batch: leases', and permits' (see ``scripts``).
_REFRESHES = ("refresh_many", "refresh_permits")


class Scripts:
    """The scripts of :data:`~django_tasklock.backends.redis.scripts.SCRIPTS` on ``client``."""

    def __init__(self, client: Any) -> None:
        from redis.cluster import RedisCluster

        self.client = client
        #: Keys of two slots never share a script: on a ``RedisCluster`` from the
        #: start; on a plain client once a server refuses them (``CROSSSLOT``: a
        #: proxy in front of a cluster, which hides its topology).
        self.cluster = isinstance(client, RedisCluster)
        self.per_slot = self.cluster
        self.bodies = {name: PRELUDE + body for name, body in SCRIPTS.items()}
        self.shas = {
            name: hashlib.sha1(body.encode()).hexdigest() for name, body in self.bodies.items()
        }
        self._sha_bytes = {name: sha.encode() for name, sha in self.shas.items()}
        #: A plain client's calls skip redis-py's command layers (see ``lean``).
        self.lean = None if self.cluster else Lean.of(client)
        #: Per master's client (a cluster's), its lean path for batches.
        self._leans: dict[int, Lean] = {}
        #: How long a release's tombstone lives: the client's retry window (``retries``).
        self.tombstone_ms = retry_window_ms(client)

    def load(self) -> None:
        """``SCRIPT LOAD`` every script; on a cluster, on every master that answers.

        A master that cannot be reached (down, paused, in a failover) is
        skipped: it meets ``NOSCRIPT`` and loads them when it answers again,
        and the call that asked for the scripts, on a master that answered,
        goes on. Only when no master answers is the error raised.
        """
        if not self.cluster:
            for body in self.bodies.values():
                self.client.script_load(body)
            return
        from redis.exceptions import ConnectionError, TimeoutError

        masters = self.client.get_primaries()
        errors: list[Exception] = []
        for node in masters:
            pipe = self.client.get_redis_connection(node).pipeline(transaction=False)
            for body in self.bodies.values():
                pipe.script_load(body)
            try:
                pipe.execute()
            except (ConnectionError, TimeoutError) as error:
                errors.append(error)
        if len(errors) == len(masters) and errors:
            raise errors[0]

    def run(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        from redis.exceptions import NoScriptError  # imported by the client already

        lean = self.lean
        if lean is not None and lean.usable():
            send = functools.partial(lean.evalsha, self._sha_bytes[name], keys, args)
        else:
            send = functools.partial(self.client.evalsha, self.shas[name], len(keys), *keys, *args)
        try:
            return send()
        except NoScriptError:
            self.load()
            return send()

    def run_batch(self, batch: RefreshBatch, failed: dict[int, Exception]) -> list[Any]:
        """The replies to a heartbeat's ``refresh_many`` calls (:class:`RefreshBatch`).

        A plain client's lean path sends the batch's calls packed once, on
        one connection, in one exchange; a call met with ``NOSCRIPT`` is sent
        again on its own once the scripts are loaded, and any other error
        reply is raised. Else :meth:`run_refreshes` for one call and
        :meth:`run_many` for several (``failed`` as there).
        """
        from redis.exceptions import NoScriptError

        calls = batch.calls
        packed = batch.packed
        if packed is None:
            packed = batch.packed = [pack(self._sha_bytes[n], k, a) for n, k, a in calls]
        if self.cluster:
            return self.run_many(calls, failed, packed)
        lean = self.lean
        if lean is None or not lean.usable():
            if len(calls) == 1:
                return [self.run_refreshes(calls[0])]
            return self.run_many(calls, failed)
        replies = lean.evalsha_many(packed)
        for index, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                replies[index] = self.run_refreshes(calls[index])  # loads the scripts
            elif isinstance(reply, Exception):
                raise reply
        return replies

    def _lean_for(self, target: Any) -> Lean | None:
        """The lean path on ``target`` (a cluster master's client, or ours), where it can."""
        lean = self._leans.get(id(target))
        if lean is None or lean.client is not target:
            lean = Lean.of(target)
            if lean is None:
                return None
            self._leans[id(target)] = lean
        return lean if lean.usable() else None

    def run_refreshes(self, call: Call) -> Any:
        """A ``refresh_many`` call, sent on its own; on a cluster that keeps refusing it
        (``TRYAGAIN`` until redis-py gives up: its slot is half migrated and a key
        it names is on neither node, a lease lost), one ``refresh`` per key,
        which the cluster serves wherever each key is."""
        from redis.exceptions import ClusterError, TryAgainError

        try:
            return self.run(*call)
        except (ClusterError, TryAgainError) as exc:
            # "TTL exhausted" is a bare ClusterError; a cluster down is not split.
            if not self.cluster or not (
                isinstance(exc, TryAgainError) or type(exc) is ClusterError
            ):
                raise
            name, keys, args = call
            n = 4 if name == "refresh_permits" else 3  # arguments per key: "refresh"'s
            return [self.run("refresh", [k], args[n * i : n * i + n]) for i, k in enumerate(keys)]

    def run_many(
        self,
        calls: Sequence[Call],
        failed: dict[int, Exception] | None = None,
        packed: Sequence[bytes] | None = None,
    ) -> list[Any]:
        """Every call pipelined (not a transaction); the replies in order.

        ``packed``: each call's ``EVALSHA`` already packed (a heartbeat's
        :class:`RefreshBatch`), sent as it is where a master's client allows
        the lean path (see ``lean``), instead of through redis-py's pipeline.

        With ``failed``, on a cluster a master that cannot be reached, or that
        answers an error (``CLUSTERDOWN`` while it sees the cluster down, in a
        failover), does not fail the calls of the others: the failed calls'
        replies are None, and their indexes are put in ``failed`` with the error.

        On a ``RedisCluster``, one plain pipeline per master, by the slot
        layout the client knows (redis-py's cluster pipeline costs several
        times the CPU per command). A call met with ``NOSCRIPT``, ``MOVED``,
        ``ASK`` or ``TRYAGAIN`` (a slot moving, a failover) is sent again on
        its own through the client, which loads the scripts or follows the
        slot (a ``refresh_many`` by :meth:`run_refreshes`); any other error is
        raised (with ``failed`` on a cluster: put there).
        """
        from redis.cluster import RedisCluster
        from redis.exceptions import (
            AskError,
            ConnectionError,
            MovedError,
            NoScriptError,
            RedisError,
            TimeoutError,
            TryAgainError,
        )

        groups: dict[str, tuple[Any, list[int]]] = {}
        if isinstance(self.client, RedisCluster):
            for index, (_, keys, _) in enumerate(calls):
                node = self.client.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
                groups.setdefault(node.name, (node, []))[1].append(index)
        else:
            groups[""] = (None, list(range(len(calls))))
        replies: list[Any] = [None] * len(calls)
        again: list[int] = []
        for node, indexes in groups.values():
            target = self.client if node is None else self.client.get_redis_connection(node)
            lean = None if packed is None else self._lean_for(target)
            try:
                if lean is not None:
                    answers = lean.evalsha_many([packed[index] for index in indexes])  # type: ignore[index]
                else:
                    pipe = target.pipeline(transaction=False)
                    for index in indexes:
                        name, keys, args = calls[index]
                        pipe.execute_command("EVALSHA", self.shas[name], len(keys), *keys, *args)
                    answers = pipe.execute(raise_on_error=False)
            except (ConnectionError, TimeoutError) as error:
                if node is None:
                    raise
                self.client.nodes_manager.initialize()  # a master gone: the layout again
                if failed is None:
                    raise
                failed.update(dict.fromkeys(indexes, error))
                continue
            for index, answer in zip(indexes, answers, strict=True):
                if isinstance(answer, (NoScriptError, MovedError, AskError, TryAgainError)):
                    again.append(index)
                elif isinstance(answer, Exception):
                    if node is None or failed is None:
                        raise answer
                    failed[index] = answer  # this call only: the others were answered
                else:
                    replies[index] = answer
        for index in again:
            call = calls[index]
            try:
                replies[index] = (
                    self.run_refreshes(call) if call[0] in _REFRESHES else self.run(*call)
                )
            except RedisError as error:
                unreachable = isinstance(error, (ConnectionError, TimeoutError))
                if failed is None or not (unreachable or self.cluster):
                    raise
                failed[index] = error
        return replies


class RefreshBatch:
    """What ``refresh_many`` sends for one tuple of leases, built once and kept.

    The heartbeat passes the same tuple tick after tick while no lease comes
    or goes (see ``leases.refreshing``): the keys' chunks, each chunk's call,
    and on the lean path its packed bytes are made the first time only, so
    a tick at 10,000 leases costs the exchange, not 40,000 arguments made and
    encoded again. ``per_slot``: each chunk in one hash slot (see ``slots``).
    """

    def __init__(
        self,
        items: Sequence[Any],
        stored: Sequence[str],
        per_slot: bool,
        permits: Sequence[str | None] = (),
    ) -> None:
        """``permits``: per item, its permit's number (``refresh_permits``), or None."""
        self.items = items
        self.per_slot = per_slot
        #: Indexes of ``items``, one list per call.
        self.chunks = _chunks(stored, per_slot) if not any(permits) else []
        if not self.chunks:  # a call is of leases or of permits, never both
            leases = [i for i, slot in enumerate(permits) if slot is None]
            limited = [i for i, slot in enumerate(permits) if slot is not None]
            self.chunks = [
                [indexes[i] for i in chunk]
                for indexes in (leases, limited)
                for chunk in _chunks([stored[i] for i in indexes], per_slot)
            ]
        known: dict[timedelta, int] = {}  # each ttl's and cap's: most leases share one
        self.calls: list[Call] = []
        for chunk in self.chunks:
            args: list[Any] = []
            limited_call = bool(permits) and permits[chunk[0]] is not None
            for index in chunk:
                item = items[index]
                ttl = known.get(item.ttl) or known.setdefault(item.ttl, ms(item.ttl))
                cap = known.get(item.max_lifetime) or known.setdefault(
                    item.max_lifetime, ms(item.max_lifetime)
                )
                args += (item.token, ttl, cap)
                if limited_call:
                    args.append(permits[index])
            name = "refresh_permits" if limited_call else "refresh_many"
            self.calls.append((name, [stored[index] for index in chunk], args))
        #: The calls packed for the lean path, made on first use (see :meth:`Scripts.run_batch`).
        self.packed: list[bytes] | None = None


def _chunks(stored: Sequence[str], per_slot: bool) -> list[list[int]]:
    from django_tasklock.backends.redis.slots import chunked

    return chunked(stored, REFRESH_CHUNK, per_slot=per_slot)


def answers_of(reply: Any) -> list[bool]:
    """A ``refresh_many`` reply, one ``"1"``/``"0"`` per key, as one answer per key.

    Also a list of integers (``run_refreshes``' key-by-key fallback).
    """
    if isinstance(reply, bytes):
        return [char == 49 for char in reply]  # b"1"
    if isinstance(reply, str):  # a client that decodes replies
        return [char == "1" for char in reply]
    return [bool(answer) for answer in reply]


def ms(duration: timedelta) -> int:
    """A duration in whole milliseconds, rounded up, at least 1: what every script is sent."""
    return max(1, math.ceil(duration / timedelta(milliseconds=1)))
