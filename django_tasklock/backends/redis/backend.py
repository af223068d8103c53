"""Leases in Redis: one string key per lock, expired by Redis itself.

The stored value is ``"<token>@<acquired_ms>"``, the acquisition time in
milliseconds by the Redis server's clock (``TIME``), so that refresh can cap a
lease at acquisition + ``max_lifetime`` and ``list`` can say when it began.
Every decision is made inside a Lua script, atomically and by the server's
clock; no worker's clock is ever consulted.

A key in the namespace is *free* (taken over by :meth:`RedisBackend.acquire`,
deleted by :meth:`RedisBackend.clear_stale`, hidden from ``peek``/``list``)
when it is gone, when it has no TTL (no lease written here lacks one), or when
its acquisition is more than 24 h old. A value not in our format but with a
TTL (another tool's, or an older version's) is treated as held until it
expires: we never steal what we cannot date.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_tasklock.backends.base import (
    KEY_PREFIX,
    PERMIT_SEPARATOR,
    RERUN_LIFETIME,
    STALE_AFTER,
    BaseBackend,
    Capabilities,
    HeldLock,
    Holder,
    PartlyRefreshed,
    Refresh,
    Released,
    caller_key,
    check_limited_key,
    lease_id,
    limited_key,
    permit_key,
    storage_key,
)
from django_tasklock.backends.forksafe import ForkSafeLock
from django_tasklock.backends.listening import Watch
from django_tasklock.backends.redis.calls import Call, RefreshBatch, Scripts, answers_of, ms
from django_tasklock.backends.redis.checks import (
    check_redis,
    eviction_warnings,
    location,
    read_policies,
    warn_at_first_use,
)
from django_tasklock.backends.redis.connections import connect
from django_tasklock.backends.redis.releases import half_migrated, release_lease
from django_tasklock.backends.redis.replicas import (
    DEFAULT_TIMEOUT,
    ack_from_settings,
    mark_unconfirmed,
    replica_ack,
    send_and_wait,
    unconfirmed,
)
from django_tasklock.backends.redis.replies import at_ms, held_lock, permits_held, text
from django_tasklock.backends.redis.scripts import (
    RERUN_PREFIX,
    fence_key,
    held_at,
    key_of_mark,
    rerun_key,
    tombstone_key,
)
from django_tasklock.backends.redis.signals import RedisListener
from django_tasklock.backends.redis.slots import chunked, tag_for
from django_tasklock.backends.redis.urls import RedisURLError, parse_url
from django_tasklock.durations import Duration
from django_tasklock.exceptions import LimitMismatch
from django_tasklock.processes import holder_gone, this_machine

if TYPE_CHECKING:
    # redis-py is imported when a connection is made, never at import: without
    # the [redis] extra this module still imports, so that ``manage.py check``
    # can say what is missing (E002) instead of "could not be imported".
    import redis
    from redis.cluster import RedisCluster

_STALE_MS = int(STALE_AFTER / timedelta(milliseconds=1))
_STALE_ARG = b"%d" % _STALE_MS  # bytes: redis-py sends them as they are, no encoding per call
_RERUN_MS = int(RERUN_LIFETIME / timedelta(milliseconds=1))
_BATCH = 500
# Acquisitions that find the key held by a process of this machine gone, take
# it over, and find it held by another gone one: at most so many in a row.
_TAKEOVER_ATTEMPTS = 3
_ms = ms


class RedisBackend(BaseBackend):
    """Leases in Redis, judged by the Redis server's clock.

    Give exactly one source: a ``redis.Redis`` or ``redis.cluster.RedisCluster``
    ``client``, a ``url``, or the ``cache_alias`` of a django-redis cache. The
    connection is made on first use, never at construction or import.
    Connection errors propagate. A ``url`` that does not read is a
    ``ValueError`` naming ``url`` here (from the settings:
    ``ImproperlyConfigured`` naming ``TASKLOCK_REDIS_URL``).

    ``min_replicas`` (``TASKLOCK_REDIS_MIN_REPLICAS``): after each acquisition
    and fence, ``WAIT`` for that many replicas, at most ``replica_timeout``
    (``TASKLOCK_REDIS_REPLICA_TIMEOUT``, 1 s); fewer is ``ReplicationNotConfirmed``.
    A "run once more" mark (:meth:`mark_rerun`) is waited for alike.
    """

    capabilities = Capabilities(dead_holders=True, permits=True, rerun=True)

    def __init__(
        self,
        client: redis.Redis | RedisCluster | None = None,
        *,
        url: str | None = None,
        cache_alias: str | None = None,
        min_replicas: int = 0,
        replica_timeout: Duration = DEFAULT_TIMEOUT,
    ) -> None:
        if sum(source is not None for source in (client, url, cache_alias)) != 1:
            raise TypeError("RedisBackend takes exactly one of client, url and cache_alias")
        if url is not None:
            try:
                parse_url(url, "url")
            except RedisURLError as exc:
                raise ValueError(str(exc)) from None
        self._ack = replica_ack(min_replicas, replica_timeout)
        self._client = client
        self._url = url
        self._cache_alias = cache_alias
        self._scripts: Scripts | None = None
        self._init_lock = ForkSafeLock()
        #: The heartbeat's last batch, kept while it sends the same leases (``calls``).
        self._batch: RefreshBatch | None = None
        #: The first use's ``maxmemory-policy`` look (W002), on a thread of its own.
        self.policy_check: threading.Thread | None = None
        #: The process's subscriptions for waiters (``signals``), made on first wait.
        self._listener: RedisListener | None = None

    @classmethod
    def from_settings(cls) -> RedisBackend:
        """``TASKLOCK_REDIS_URL`` when set, else the ``TASKLOCK_REDIS_CACHE`` alias."""
        from django_tasklock.conf import conf

        ack = ack_from_settings()  # ImproperlyConfigured naming the setting
        if conf.REDIS_URL:
            parse_url(conf.REDIS_URL)  # ImproperlyConfigured naming the setting
        url, alias = conf.REDIS_URL, None if conf.REDIS_URL else conf.REDIS_CACHE
        backend = cls(url=url, cache_alias=alias)
        backend._ack = ack
        return backend

    @classmethod
    def check(cls) -> list[Any]:
        """E002: redis-py (or, without a URL, django-redis) is missing; E003-E004: the cache."""
        return check_redis()

    def eviction_check(self) -> list[Any]:
        """``django_tasklock.W002`` if a server may evict a live lease, read now.

        Its ``maxmemory-policy`` (``CONFIG GET``; on a cluster, of every master)
        is anything but ``noeviction``. A server that refuses ``CONFIG GET``
        (managed Redis) is not reported; connection errors propagate. The
        deploy check ``manage.py check --deploy`` calls this.
        """
        with self._init_lock:
            if self._client is None:
                self._client = connect(self._url, self._cache_alias)
            client = self._client
        return eviction_warnings(read_policies(client))

    def location(self) -> str:
        """Where the leases are kept, for people (a demo, a log line): server and db.

        ``127.0.0.1:6379, db 0``; never a password. Connects if not yet connected.
        """
        return location(self._conn())

    def storage_time(self) -> float | None:
        """Redis's ``TIME``; None on a Redis Cluster, whose every master has a clock of its own."""
        scripts = self._calls()
        if scripts.cluster:
            return None
        seconds, micros = scripts.client.time()
        return float(seconds) + float(micros) / 1e6

    def _conn(self) -> redis.Redis | RedisCluster:
        """The connection, made on first use, once across threads."""
        return self._calls().client  # type: ignore[no-any-return]

    def _calls(self) -> Scripts:
        """The scripts on the connection."""
        scripts = self._scripts
        if scripts is None:
            with self._init_lock:
                if self._scripts is None:
                    if self._client is None:
                        self._client = connect(self._url, self._cache_alias)
                    made = Scripts(self._client)
                    # W002 if the policy may evict a lease; never waited for here.
                    self.policy_check = warn_at_first_use(self._client)
                    self._scripts = made
                    tag_for(KEY_PREFIX)  # the slot table, built now rather than in a release
                scripts = self._scripts
        return scripts

    def watch(self, key: str, wake: Callable[[], None]) -> AbstractContextManager[Watch]:
        """The process's ``SSUBSCRIBE`` connection (``signals``); none on a Cluster client."""
        scripts = self._calls()
        if scripts.cluster:
            return super().watch(key, wake)
        listener = self._listener
        if listener is None:
            with self._init_lock:
                if self._listener is None:
                    self._listener = RedisListener(scripts.client, location(scripts.client))
                listener = self._listener
        return listener.watch(storage_key(key), wake)

    def _run(self, name: str, key: str | bytes, *args: Any) -> Any:
        return self._calls().run(name, [key], args)

    def _grant(self, name: str, key: str, token: str, keys: list[str], args: list[Any]) -> Any:
        """Run a script that grants (``acquire``, ``permit``, ``fence``); ``WAIT`` after it
        if asked to.

        Only a positive integer is a grant (no fence is 0; ``permit`` answers
        its number + 1): a refusal that names holders (a token, a list) or a
        limit grants nothing.
        """
        scripts = self._calls()
        if self._ack is None:
            return scripts.run(name, keys, args)
        reply, acked = send_and_wait(scripts, name, keys, args, self._ack)
        granted = isinstance(reply, int) and reply > 0
        if granted and acked < self._ack.count:  # granted, too few replicas
            held = permit_key(key, reply - 1) if name == "permit" else key
            raise unconfirmed(lambda: self.release(held, token), held, self._ack, acked)
        return reply

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        """``SET NX PX`` by the server clock; also takes over a key abandoned for 24 h.

        The first lease lasts ``min(ttl, max_lifetime)``, so even it respects the cap.
        A token whose lease was released (its tombstone is there) is refused,
        and nothing written: that is an acquisition arriving late, after the
        client sent it again, was granted, and the work ran and released.

        A key held by a token of this machine is answered with that token;
        if its holder is provably gone (``holder_gone``), the script is sent
        again naming it, and takes the key over only while that token still
        holds it (of two processes doing so, the second finds the first's).
        """
        machine = this_machine()
        args = [
            token,
            _ms(min(ttl, max_lifetime)),
            _STALE_ARG,
            "" if machine is None else f"/{machine}.",
            "",
        ]
        keys = [storage_key(key), tombstone_key(key, token)]
        try:
            return self._acquire(key, token, keys, args)
        except Exception as exc:
            # A slot half migrated refuses the two keys for as long as the move lasts
            # (a tombstone never exists before its release): the lease alone then,
            # the tombstone read on its own first (see ``releases``).
            if not self._calls().cluster or not half_migrated(exc):
                raise
            if text(self._calls().client.get(keys[1]) or b"") == token:
                return False
            return self._acquire(key, token, keys[:1], args)

    def _acquire(self, key: str, token: str, keys: list[str], args: list[Any]) -> bool:
        for _ in range(_TAKEOVER_ATTEMPTS):
            if self._ack is None:
                reply = self._calls().run("acquire", keys, args)
            else:
                reply = self._grant("acquire", key, token, keys, args)
            if isinstance(reply, list):  # ["limit", N]: permits hold the key
                raise LimitMismatch(key, held=int(reply[1]), asked=1)
            if not isinstance(reply, (bytes, str)):
                return bool(reply)
            # Held by a process of this machine: taken over if it is gone.
            held = text(reply)
            if holder_gone(Holder.from_token(held)) is not True:
                return False
            args = [*args[:4], held]
        return False  # the key changed hands to dead holders at every attempt

    def acquire_permit(
        self, key: str, token: str, *, limit: int, ttl: timedelta, max_lifetime: timedelta
    ) -> str | None:
        """One script (``permit``): the key's hash of permits, by the server's clock.

        Permit ``n`` of ``key`` is field ``n`` of the hash ``task-lock:<key>``
        (its value the token, acquisition and end in milliseconds), so that all
        of a key's permits are one key, in one Cluster slot. A late request
        (its token's tombstone is there) writes nothing; one sent again finds
        its permit. When all are held and some by tokens of this machine, each
        is looked for, and the permit of one found gone is taken over, as
        :meth:`acquire` does.
        """
        check_limited_key(key, limit)
        machine = this_machine()
        args = [
            token,
            _ms(min(ttl, max_lifetime)),
            limit,
            _STALE_ARG,
            "" if machine is None else f"/{machine}.",
            "",
        ]
        keys = [storage_key(key), tombstone_key(key, token)]
        try:
            return self._take_permit(key, token, limit, keys, args)
        except Exception as exc:
            # A slot half migrated: the tombstone read alone, as ``acquire`` does.
            if not self._calls().cluster or not half_migrated(exc):
                raise
            released = text(self._calls().client.get(keys[1]) or b"")
            if released.startswith(token + PERMIT_SEPARATOR):  # the token's permit's release
                return None
            return self._take_permit(key, token, limit, keys[:1], args)

    def _take_permit(
        self, key: str, token: str, limit: int, keys: list[str], args: list[Any]
    ) -> str | None:
        for _ in range(_TAKEOVER_ATTEMPTS):
            if self._ack is None:
                reply = self._calls().run("permit", keys, args)
            else:
                reply = self._grant("permit", key, token, keys, args)
            if isinstance(reply, int):
                return permit_key(key, reply - 1)
            if not reply:
                return None
            kind, *rest = (text(part) if isinstance(part, bytes) else part for part in reply)
            if kind == "limit":
                raise LimitMismatch(key, held=int(rest[0]), asked=limit)
            # All held, some by processes of this machine: one taken over if gone.
            gone = next((t for t in rest if holder_gone(Holder.from_token(t)) is True), None)
            if gone is None:
                return None
            args = [*args[:5], gone]
        return None  # the permits changed hands to dead holders at every attempt

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        """Set the TTL to ``min(ttl, acquired + max_lifetime - now)``; untouched if that is <= 0.

        A lease that expired is gone from Redis, so it is reported lost, never revived.
        """
        stored, slot = _lease_of(key)
        return bool(self._run("refresh", stored, token, _ms(ttl), _ms(max_lifetime), *slot))

    def refresh_many(self, items: Sequence[Refresh]) -> list[bool]:
        """One EVALSHA per chunk of 500 leases, each judged as :meth:`refresh` would.

        On Redis Cluster a script never carries keys of two slots (the
        cluster refuses them), so leases are grouped by their key's slot
        first. A single Redis takes any 500 keys in one script; one that
        refuses them (``CROSSSLOT``: a proxy hiding a cluster) is sent them per
        slot from then on. The scripts go in one pipeline (one round trip; on a
        cluster, one per master: one unreachable raises ``PartlyRefreshed``
        with the others' answers). A Redis that stops answering fails the call
        after the socket timeout (10 s for a ``url``; a django-redis cache's own).
        The calls made for one tuple of ``items`` are kept for the next call with
        the same tuple (the heartbeat's, while no lease comes or goes).
        """
        scripts = self._calls()
        per_slot = scripts.per_slot
        batch = self._batch
        if batch is None or batch.items is not items or batch.per_slot is not per_slot:
            stored = [held_at(item.key) for item in items]
            permits = [_permit_of(item.key) for item in items]
            batch = self._batch = RefreshBatch(items, stored, per_slot, permits)
        failed: dict[int, Exception] = {}
        try:
            replies = scripts.run_batch(batch, failed)
        except Exception as exc:
            from redis.exceptions import ClusterCrossSlotError

            # Refused before it ran (a proxy in front of a cluster): per slot from now on.
            if per_slot or not isinstance(exc, ClusterCrossSlotError):
                raise
            scripts.per_slot = True
            return self.refresh_many(items)
        answers: list[bool | None] = [None] * len(items)  # None: its master failed
        for n, (chunk, reply) in enumerate(zip(batch.chunks, replies, strict=True)):
            if n not in failed:
                for index, answer in zip(chunk, answers_of(reply), strict=True):
                    answers[index] = answer
        if failed:
            raise PartlyRefreshed(answers, next(iter(failed.values())))
        return answers  # type: ignore[return-value] # every one answered

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        """Delete the lease held by ``token``; with ``min_hold``, cut it (marked released)
        to end at acquisition + ``min_hold`` (by the server's clock) while that is ahead."""
        return self.release_outcome(key, token, min_hold=min_hold) is Released.RELEASED

    def release_outcome(
        self, key: str, token: str, *, min_hold: timedelta | None = None
    ) -> Released:
        """:meth:`release`; ``GONE`` only when this release, sent before, ended the lease.

        A client that retries may have run the script already (its reply
        lost): ending a lease leaves a tombstone naming the token for the
        client's retry window, at least 60 s (one more ``SET``), which the same
        release sent again finds: ``GONE``, also when a successor holds the key
        by then. A key gone without it (expired,
        force-released, evicted), or someone else's, is ``LOST``. With
        ``min_hold``, the lease cut to end then is marked released, so that no
        refresh extends it.
        """
        return release_lease(self._calls(), key, token, 0 if min_hold is None else _ms(min_hold))

    def fence(self, key: str, token: str) -> int | None:
        """``INCR tasklock-fence:{<tag>}<key>`` in the same script that checks the lease.

        Never less than the server's clock in microseconds, so that a counter
        lost with a restart, ``FLUSHDB`` or a failover starts again above
        every fence handed out before (unless that clock went back).
        """
        stored, slot = _lease_of(key)
        keys, args = [stored, fence_key(key)], [token, _STALE_MS, *slot]
        reply = self._grant("fence", key, token, keys, args)
        return None if reply is None else int(reply)

    def mark_rerun(self, key: str, payload: str) -> bool:
        """The ``mark`` script: the mark ``tasklock-rerun:{<tag>}<key>`` (a hash in the
        lease's slot) written in the script that finds a live mutex's lease at the key.

        With ``min_replicas``, a mark written is followed by ``WAIT``; fewer
        replicas than asked is ``ReplicationNotConfirmed`` (the mark stays, and
        may be lost in a failover: the caller is told it is not known to last).
        """
        keys = [storage_key(key), rerun_key(key)]
        args = [payload, _RERUN_MS, _STALE_ARG]
        scripts = self._calls()
        if self._ack is None:
            return bool(scripts.run("mark", keys, args))
        reply, acked = send_and_wait(scripts, "mark", keys, args, self._ack)
        if reply == 1 and acked < self._ack.count:
            raise mark_unconfirmed(key, self._ack, acked)
        return bool(reply)

    def take_rerun(self, key: str, token: str, taking: int) -> str | None:
        """The ``take`` script: the mark's payload moved to the take's answer, recorded
        with the token and ``taking``, while ``token`` holds the key's live lease."""
        keys = [storage_key(key), rerun_key(key)]
        args = [token, taking, _STALE_ARG, self._calls().tombstone_ms]
        reply = self._calls().run("take", keys, args)
        return None if reply is None else text(reply)

    def rerun_marks(self, key: str | None = None) -> dict[str, datetime]:
        """``key``'s mark (the ``marked`` script), or every mark found with ``SCAN``
        (on a cluster, of every master), ordered by key."""
        if key is not None:
            reply = self._run("marked", rerun_key(key), _RERUN_MS)
            return {} if reply is None else {key: at_ms(int(reply))}
        found = self._scan(RERUN_PREFIX)
        marks: dict[str, datetime] = {}
        for start in range(0, len(found), _BATCH):
            batch = found[start : start + _BATCH]
            calls: list[Call] = [("marked", [name], [_RERUN_MS]) for name in batch]
            for name, reply in zip(batch, self._calls().run_many(calls), strict=True):
                if reply is not None:
                    marks[key_of_mark(text(name))] = at_ms(int(reply))
        return dict(sorted(marks.items()))

    def force_release(self, key: str, lease: str | None = None) -> HeldLock | None:
        """Look, then delete by the token seen (the ``evict`` script): never a successor's.

        The lease seen is returned even if ``evict`` found it gone (a retry
        of a command whose reply was lost finds nothing; the first ended it).
        """
        stored, slot = _lease_of(key)
        reply = self._run("inspect", stored, _STALE_MS, *slot)
        found = held_lock(key, reply)
        if found is None or (lease is not None and found.lease != lease):
            return None
        self._run("evict", stored, text(reply[0]), *slot)
        return found

    def _scan(self, prefix: str) -> list[Any]:
        """Every key whose name starts with ``prefix`` (found with ``SCAN``), sorted."""
        # SCAN may return a key twice; the set keeps counts and listings exact.
        # On a cluster, redis-py's scan_iter SCANs every master it knows: the
        # layout is read again first, or a master that joined (or was promoted)
        # since the client last met a MOVED would go unscanned.
        scripts = self._calls()
        if scripts.cluster:
            scripts.client.nodes_manager.initialize()
        return sorted(set(scripts.client.scan_iter(match=prefix + "*", count=_BATCH)))

    def _of_machine(self, mine: str, skip: frozenset[str]) -> list[tuple[str, Any]]:
        """The ``of_machine`` script's answer for every key in the namespace but those whose
        caller's key is in ``skip``: (caller's key, reply) by key; 500 keys per script
        (per slot where the storage takes one slot per script)."""
        scripts = self._calls()
        named = [(stored, caller_key(stored)) for stored in map(text, self._scan(KEY_PREFIX))]
        named = [(stored, name) for stored, name in named if name not in skip]
        per_slot = scripts.per_slot
        chunks = chunked([stored for stored, _ in named], _BATCH, per_slot=per_slot)
        calls: list[Call] = [
            ("of_machine", [named[i][0] for i in chunk], [mine, _STALE_MS]) for chunk in chunks
        ]
        if not calls:
            return []
        try:
            replies = scripts.run_many(calls)
        except Exception as exc:
            from redis.exceptions import ClusterCrossSlotError

            # Refused before it ran (a proxy in front of a cluster): per slot from now on.
            if per_slot or not isinstance(exc, ClusterCrossSlotError):
                raise
            scripts.per_slot = True
            return self._of_machine(mine, skip)
        return [
            (named[i][1], answer)
            for chunk, reply in zip(chunks, replies, strict=True)
            for i, answer in zip(chunk, reply, strict=True)
        ]

    def _run_all(self, name: str, *args: Any) -> list[tuple[str, Any]]:
        """Run a script on every key in the namespace: (caller's key, reply) by key."""
        scripts = self._calls()
        found = self._scan(KEY_PREFIX)
        results = []
        for start in range(0, len(found), _BATCH):
            batch = found[start : start + _BATCH]
            replies = scripts.run_many([(name, [stored], args) for stored in batch])
            results += [(caller_key(text(k)), r) for k, r in zip(batch, replies, strict=True)]
        return results

    def peek(self, key: str) -> HeldLock | None:
        """The holding lease; a value not written here shows holder ``?`` (see :meth:`list`)."""
        stored, slot = _lease_of(key)
        return held_lock(key, self._run("inspect", stored, _STALE_MS, *slot))

    def list(self) -> list[HeldLock]:
        """Every held key in the namespace (found with ``SCAN``), ordered by key.

        A value in the namespace that this backend did not write still blocks
        acquisition until it expires, so it is listed (holder ``?`` unless it
        looks like a bare token) with ``acquired_at`` the time of reading. A
        limited key's live permits are listed each by its name
        (``permit_key``); one more script per limited key.
        """
        held: list[HeldLock] = []
        limited: list[str] = []
        for key, reply in self._run_all("inspect", _STALE_MS):
            found = held_lock(key, reply)
            if found is not None:
                held.append(found)
            elif reply is None:
                limited.append(key)  # free, or a limited key's hash: looked at below
        scripts = self._calls()
        calls: list[Call] = [("permits", [storage_key(key)], []) for key in limited]
        for key, reply in zip(limited, scripts.run_many(calls), strict=True):
            held += permits_held(key, reply)
        return sorted(held, key=lambda lock: lock.key)

    def reap_dead_holders(self, alive: Collection[str] = ()) -> Sequence[HeldLock]:
        """A ``SCAN`` of the namespace, a script per 500 keys found; ``reap`` each holder gone.

        One script per 500 keys (on a cluster, per hash slot and 500 keys;
        all pipelined) answers the tokens of this machine's live leases (not
        one cut for ``min_hold``); a lease whose holder is provably gone is
        deleted by a script bound to its token (``reap``), never a
        successor's. A key named in ``alive`` (the caller's own leases: a
        holder that refreshes them is alive) is not looked at; a limited
        key's permits are named apart (``permit_key``), so its key is looked
        at for the other permits.
        """
        machine = this_machine()
        if machine is None:
            return []
        found: list[tuple[str, str]] = []  # (a lease's name, its token)
        for key, reply in self._of_machine(f"/{machine}.", frozenset(alive)):
            if isinstance(reply, list):  # a limited key's permits: number, token...
                parts = [text(part) for part in reply]
                pairs = zip(parts[::2], parts[1::2], strict=True)
                found += [(permit_key(key, int(n)), token) for n, token in pairs]
            elif reply is not None:
                found.append((key, text(reply)))
        ended = []
        for name, token in found:
            holder = Holder.from_token(token)
            if holder.machine != machine or holder_gone(holder) is not True:
                continue
            stored, slot = _lease_of(name)
            seen = held_lock(name, self._run("inspect", stored, _STALE_MS, *slot))
            ours = seen is not None and seen.lease == lease_id(token)
            if ours and self._run("reap", stored, token, *slot):
                assert seen is not None
                ended.append(seen)
        return ended

    def clear_stale(self, *, dry_run: bool = False) -> int:
        """Delete keys no lease should leave behind; return how many (or would be).

        Redis deletes expired leases itself, so this only removes keys in the
        namespace without a TTL and keys acquired more than 24 h ago; neither
        should exist. Each key's condition is re-checked atomically as it is deleted.
        """
        flag = "0" if dry_run else "1"
        return sum(int(reply) for _, reply in self._run_all("clear", _STALE_MS, flag))


def _lease_of(name: str) -> tuple[str, tuple[str, ...]]:
    """The stored key of a lease's name, and the scripts' argument naming a permit in it."""
    if PERMIT_SEPARATOR not in name:
        return storage_key(name), ()
    key, slot = limited_key(name)
    return storage_key(key), (str(slot),)


def _permit_of(name: str) -> str | None:
    """The number of the permit ``name`` names, as the scripts take it; None for a lease."""
    return None if PERMIT_SEPARATOR not in name else name.rpartition(PERMIT_SEPARATOR)[2]
