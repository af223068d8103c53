"""Leases as rows of the ``cache_entries`` table, in any database Django supports.

Atomicity comes from the primary key: two concurrent inserts of one key cannot
both succeed, so acquisition is an ORM ``create()`` and an ``IntegrityError``
on the key means "held" (once the row is seen to exist; see ``acquisitions``,
and ``releases`` for the other end). Every time is the
database server's clock in UTC (``UtcNow``, see ``functions``), so
neither workers' clocks nor sessions' time zones decide who holds a key.

Statements run in autocommit, one round trip each: acquiring a free key is one
INSERT, releasing is one DELETE, a refresh is one UPDATE. Only an INSERT that
conflicts is followed by a SELECT of the row, which tells "held" from "free to
take over" (expired, or older than 24 h: see ``rows``) by the server's
clock. A release with ``min_hold`` is one UPDATE while the hold lasts; a
fence is one more statement (see ``fences``).

``QuerySet.delete()`` is avoided on purpose: it wraps itself in a transaction,
and with signal receivers it deletes by primary key after a SELECT, which
could delete a lease taken over in between.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import Error, connections
from django.db.models import F
from django.db.models.functions import Least

from django_tasklock.backends.base import (
    PERMIT_SEPARATOR,
    BaseBackend,
    Capabilities,
    HeldLock,
    Refresh,
    Released,
    check_limited_key,
    limited_key,
    storage_key,
)
from django_tasklock.backends.database import reruns as db_reruns
from django_tasklock.backends.database import rows as db_rows
from django_tasklock.backends.database import statements as db_statements
from django_tasklock.backends.database.acquisitions import insert_lease
from django_tasklock.backends.database.checks import check_lock_database
from django_tasklock.backends.database.connections import (
    alias_for_reading,
    alias_for_writing,
    close_connections,
    in_test_transaction,
    names_missing_table,
)
from django_tasklock.backends.database.fences import (
    next_fence_in_transaction,
    next_fence_upsert,
    upsert_returns,
)
from django_tasklock.backends.database.functions import Compiled, UtcNow, server_time
from django_tasklock.backends.database.notifications import listener_for
from django_tasklock.backends.database.permits import (
    anchor_limit,
    counter_key,
    is_anchor,
    take_permit,
)
from django_tasklock.backends.database.releases import end_lease, record_forced
from django_tasklock.backends.database.retries import retry_on_new_connection, retry_when_busy
from django_tasklock.backends.forksafe import ForkSafeLock
from django_tasklock.backends.listening import Watch
from django_tasklock.conf import conf
from django_tasklock.processes import holder_gone, this_machine

if TYPE_CHECKING:
    from django_tasklock.models import CacheEntry


class DatabaseBackend(BaseBackend):
    """Leases in the ``cache_entries`` table of the database alias ``using``.

    Inside the caller's transaction the lock's statements go through a second
    connection to the same database, opened for them and closed right after,
    so that a lease is committed, and visible to other workers, at once (see
    ``connections``). Under a
    Django ``TestCase`` the test's own transaction is used instead, and the
    heartbeat (whose thread cannot see that transaction) leaves such leases
    alone: keep work under a ``TestCase`` shorter than its ``ttl``.
    """

    capabilities = Capabilities(dead_holders=True, permits=True, rerun=True)
    #: Databases whose fence is one upsert statement (the others: a transaction).
    single_statement_fence_vendors: tuple[str, ...] = ("postgresql", "sqlite")

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self._test_leases: set[tuple[str, str]] = set()
        self._test_leases_lock = ForkSafeLock()
        self._cached_model: type[CacheEntry] | None = None
        # Per alias, the release DELETEs (live rows, any row), compiled once.
        self._releases: dict[str, tuple[db_statements.Release, db_statements.Release]] = {}
        self._peeks: dict[str, db_statements.Peek] = {}  # per alias, compiled once
        self._lease_lengths: dict[timedelta, Compiled] = {}  # UtcNow() + length, built once
        self._batch: db_statements.Batch | None = None  # the last refresh_many's, kept

    @classmethod
    def from_settings(cls) -> DatabaseBackend:
        return cls(using=conf.DATABASE)

    @classmethod
    def check(cls) -> list[Any]:
        """E006: no such ``TASKLOCK_DATABASE``; W001: SQLite with ATOMIC_REQUESTS (checks)."""
        return check_lock_database(conf.DATABASE)

    # -- the contract ------------------------------------------------------

    @names_missing_table
    @retry_when_busy
    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        with alias_for_writing(self.using) as alias:
            try:
                return self._acquire(alias, storage_key(key), token, ttl, max_lifetime)
            except Error:
                _let_go_if_dead(alias)
                raise

    def _acquire(
        self, alias: str, stored: str, token: str, ttl: timedelta, max_lifetime: timedelta
    ) -> bool:
        model, expires_at = self._model(), self._ends_in(min(ttl, max_lifetime))
        outcome = insert_lease(model, alias, stored, token, expires_at)
        if outcome == "inserted" and in_test_transaction(connections[alias]):
            with self._test_leases_lock:
                self._test_leases.add((stored, token))
        return outcome != "held"

    @names_missing_table
    @retry_when_busy
    def acquire_permit(
        self, key: str, token: str, *, limit: int, ttl: timedelta, max_lifetime: timedelta
    ) -> str | None:
        """One transaction of 3 to 6 statements: the key's anchor, its rows, two writes each.

        See ``permits``: the anchor row ``task-lock:<key>`` keeps the limit,
        and makes a mutex and a limited key of one name refuse each other.
        """
        check_limited_key(key, limit)
        with alias_for_writing(self.using) as alias:
            try:
                name, inserted = take_permit(
                    self._model(),
                    alias,
                    key,
                    token,
                    limit=limit,
                    ttl=ttl,
                    max_lifetime=max_lifetime,
                )
            except Error:
                _let_go_if_dead(alias)  # the next call finds its permit on a new one
                raise
            if name is not None and inserted and in_test_transaction(connections[alias]):
                with self._test_leases_lock:
                    self._test_leases.add((storage_key(name), token))
        return name

    @names_missing_table
    @retry_when_busy
    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        stored = storage_key(key)
        if (stored, token) in self._test_leases:
            # Written in a TestCase's transaction, which the heartbeat's thread
            # cannot see; the test rolls it back anyway.
            return True
        with alias_for_writing(self.using) as alias:
            try:
                updated = (
                    self._model()
                    .objects.using(alias)
                    .filter(key=stored, value=token, expires_at__gt=UtcNow())
                    .update(expires_at=Least(UtcNow() + ttl, F("created_at") + max_lifetime))
                )
            except Error:
                # A killed or dropped connection: let the next attempt open a new one.
                connections[alias].close_if_unusable_or_obsolete()
                raise
        return updated == 1

    @names_missing_table
    @retry_when_busy
    def refresh_many(self, items: Sequence[Refresh]) -> list[bool]:
        """One UPDATE per chunk of 500 leases (per ttl and cap, except on PostgreSQL).

        Runs under a statement timeout (``timeouts.REFRESH_TIMEOUT``, 5 s) that
        ends with its statement: no session setting is left on the connection
        (see ``timeouts``). A tuple passed again (the heartbeat's, while its
        leases stay the same) reuses the rows and payloads built for it.
        """
        in_test = self._test_leases
        batch = self._batch
        if batch is None or batch.items is not items or in_test:
            batch = db_statements.Batch(items, in_test)
            if isinstance(items, tuple) and not in_test:  # the heartbeat's, sent again
                self._batch = batch
        rows = batch.rows
        ours: set[tuple[str, str]] = set()
        exact = False  # see Batch.answers
        if rows:
            model = self._model()
            with alias_for_writing(self.using) as alias:
                try:
                    ours = db_statements.refresh(model, alias, rows, batch.payloads, batch.sent)
                except Error:
                    # A killed or dropped connection: let the next attempt open a new one.
                    connections[alias].close_if_unusable_or_obsolete()
                    raise
                exact = connections[alias].vendor == "postgresql"
        if in_test:
            exact = False
            with self._test_leases_lock:
                ours |= self._test_leases
        return batch.answers(ours, exact=exact)

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        return self.release_outcome(key, token, min_hold=min_hold) is Released.RELEASED

    @names_missing_table
    def release_outcome(
        self, key: str, token: str, *, min_hold: timedelta | None = None
    ) -> Released:
        """``GONE`` only when the release was sent again on a new connection (``releases``)."""
        stored = storage_key(key)
        if self._test_leases:
            with self._test_leases_lock:
                self._test_leases.discard((stored, token))
        sends: list[None] = []
        return self._send_release(stored, token, min_hold, sends)

    @retry_on_new_connection
    def _send_release(
        self, stored: str, token: str, min_hold: timedelta | None, sends: list[None]
    ) -> Released:
        sends.append(None)
        return self._release_once(stored, token, min_hold, sent_before=len(sends) > 1)

    @retry_when_busy  # a busy or deadlocked statement was rolled back: it did nothing
    def _release_once(
        self, stored: str, token: str, min_hold: timedelta | None, *, sent_before: bool
    ) -> Released:
        with alias_for_writing(self.using) as alias:
            deletes = self._release_statements(alias)
            return end_lease(
                self._model(), alias, deletes, stored, token, min_hold, sent_before=sent_before
            )

    @names_missing_table
    @retry_when_busy  # not on a new connection: a fence sent twice would count twice
    def fence(self, key: str, token: str) -> int | None:
        """Increment ``tasklock_fences`` for ``key`` while ``token`` holds the live row.

        One statement on PostgreSQL and SQLite, a short transaction elsewhere
        (see ``fences``).
        """
        with alias_for_writing(self.using) as alias:
            held = db_rows.live_lease(self._model(), alias, storage_key(key), token)
            connection = connections[alias]
            if connection.vendor in self.single_statement_fence_vendors and upsert_returns(
                connection
            ):
                return next_fence_upsert(alias, counter_key(key), held)
            return next_fence_in_transaction(alias, counter_key(key), held)

    @names_missing_table
    @retry_on_new_connection  # sent twice, it marks once
    @retry_when_busy
    def mark_rerun(self, key: str, payload: str) -> bool:
        """A short transaction: the live lease's row locked, then the mark (``reruns``)."""
        with alias_for_writing(self.using) as alias:
            return db_reruns.mark(self._model(), alias, storage_key(key), key, payload)

    @names_missing_table
    @retry_on_new_connection  # sent twice, it answers alike (its number, ``taking``)
    @retry_when_busy
    def take_rerun(self, key: str, token: str, taking: int) -> str | None:
        """A short transaction: the mark's row locked, read, and taken (``reruns``)."""
        with alias_for_writing(self.using) as alias:
            return db_reruns.take(self._model(), alias, storage_key(key), key, token, taking)

    @names_missing_table
    @retry_when_busy
    def rerun_marks(self, key: str | None = None) -> dict[str, datetime]:
        with alias_for_reading(self.using) as alias:
            return db_reruns.marked(alias, key)

    @names_missing_table
    @retry_when_busy
    def force_release(self, key: str, lease: str | None = None) -> HeldLock | None:
        """Look at the live row, then delete it by the token seen: never a successor's.

        The lease seen is returned even if the deletion found it gone: a
        deletion re-sent after a lost reply finds nothing, though the first
        one ended it.
        """
        stored = storage_key(key)
        with alias_for_writing(self.using) as alias:
            rows = db_rows.live(self._model(), alias).filter(key=stored)
            row = rows.exclude(is_anchor()).first()  # an anchor is no lease
        if row is None:
            return None
        found = db_rows.held(row)
        if lease is not None and found.lease != lease:
            return None
        self._delete_lease(stored, row.value)
        return found

    @retry_on_new_connection
    @retry_when_busy
    def _delete_lease(self, stored: str, token: str) -> bool:
        """Delete the row of ``stored`` while ``token`` is in it, live or not, and record it.

        The record (``releases.record_forced``), written first, is how the
        holder's release, sent again after its reply was lost, tells this
        deletion from its own. Should the deletion then fail (twice), the
        record stays with the lease: only a release of it sent twice, its
        reply lost, would read it, and call its own release a loss.
        """
        with alias_for_writing(self.using) as alias:
            record_forced(alias, token)  # before the deletion: never a deletion unrecorded
            return bool(self._release_statements(alias)[1].run(alias, stored, token))

    @names_missing_table
    @retry_when_busy
    def peek(self, key: str) -> HeldLock | None:
        """One SELECT; a permit's, two: its row and its key's anchor (the limit)."""
        with alias_for_reading(self.using) as alias:
            found = self._peek_statement(alias).run(alias, storage_key(key))
            if found is None or anchor_limit(found[1]) is not None:  # an anchor is no lease
                return None
            held = db_rows.held_values(*found)
            if PERMIT_SEPARATOR not in key:
                return held
            anchor = self._peek_statement(alias).run(alias, storage_key(limited_key(key)[0]))
        limit = None if anchor is None else anchor_limit(anchor[1])
        return dataclasses.replace(held, limit=limit)

    @names_missing_table
    @retry_when_busy
    def list(self) -> list[HeldLock]:
        """One SELECT of the live rows; an anchor is no lease, but gives its permits' limit."""
        with alias_for_reading(self.using) as alias:
            rows = list(db_rows.live(self._model(), alias).order_by("key"))
        limits = {row.key: limit for row in rows if (limit := anchor_limit(row.value)) is not None}
        held = [db_rows.held(row) for row in rows if row.key not in limits]
        return [
            dataclasses.replace(lock, limit=limits.get(storage_key(limited_key(lock.key)[0])))
            if PERMIT_SEPARATOR in lock.key
            else lock
            for lock in held
        ]

    @names_missing_table
    @retry_when_busy
    def clear_stale(self, *, dry_run: bool = False) -> int:
        with alias_for_writing(self.using) as alias:
            stale = db_rows.stale(self._model(), alias)
            return stale.count() if dry_run else db_statements.delete_in_key_order(stale, alias)

    @names_missing_table
    @retry_when_busy
    def reap_dead_holders(self, alive: Collection[str] = ()) -> Sequence[HeldLock]:
        """One SELECT of this machine's live rows; a DELETE by token for each holder gone.

        The SELECT narrows the namespace to rows whose token names this
        machine (``value`` contains its mark); a row cut for ``min_hold``
        carries ``~released`` after the token and names no machine anyone can
        prove anything of. Each DELETE names the row's token: a successor's
        row, or a row deleted meanwhile, is left alone, also when sent twice.
        ``alive`` is not needed: the one SELECT reads the rows whatever they are.
        """
        machine = this_machine()
        if machine is None:
            return []
        with alias_for_writing(self.using) as alias:
            rows = db_rows.live(self._model(), alias).filter(value__contains=f"/{machine}.")
            seen = [(row.key, row.value, db_rows.held(row)) for row in rows.order_by("key")]
        return [
            held
            for stored, token, held in seen
            if held.holder.machine == machine
            and holder_gone(held.holder) is True
            and self._delete_dead(stored, token)
        ]

    @retry_on_new_connection
    @retry_when_busy
    def _delete_dead(self, stored: str, token: str) -> bool:
        with alias_for_writing(self.using) as alias:
            return bool(self._release_statements(alias)[1].run(alias, stored, token))

    @retry_when_busy
    def storage_time(self) -> float | None:
        """The database server's clock (PostgreSQL, MySQL/MariaDB); SQLite's is this host's.

        SQLite dates its rows by the host's clock, read here without a query
        (every process of the host shares it). Other databases: None.
        """
        with alias_for_reading(self.using) as alias:
            return server_time(connections[alias])

    def watch(self, key: str, wake: Callable[[], None]) -> AbstractContextManager[Watch]:
        """On PostgreSQL, the process's ``LISTEN`` connection (``notifications``); else none."""
        if connections[self.using].vendor != "postgresql":
            return super().watch(key, wake)
        return listener_for(self.using).watch(storage_key(key), wake)

    def close(self) -> None:
        close_connections(self.using)

    # -- helpers -----------------------------------------------------------

    def _release_statements(
        self, alias: str
    ) -> tuple[db_statements.Release, db_statements.Release]:
        """The token DELETEs for ``alias``, compiled on first use (again if its engine changed)."""
        compiled = self._releases.get(alias)
        if compiled is None or compiled[0].engine != connections[alias].settings_dict["ENGINE"]:
            model = self._model()
            compiled = (
                db_statements.Release(model, alias, live_only=True),
                db_statements.Release(model, alias, live_only=False),
            )
            self._releases[alias] = compiled
        return compiled

    def _peek_statement(self, alias: str) -> db_statements.Peek:
        """The look at a key for ``alias``, compiled on first use (again if its engine changed)."""
        compiled = self._peeks.get(alias)
        if compiled is None or compiled.engine != connections[alias].settings_dict["ENGINE"]:
            compiled = self._peeks[alias] = db_statements.Peek(self._model(), alias)
        return compiled

    def _ends_in(self, length: timedelta) -> Compiled:
        """``UtcNow() + length``, one expression per length, compiled once (see ``Compiled``)."""
        expression = self._lease_lengths.get(length)
        if expression is None:
            if len(self._lease_lengths) > 64:  # callers with ever-new ttls: do not grow
                self._lease_lengths.clear()
            expression = self._lease_lengths[length] = Compiled(UtcNow() + length)
        return expression

    def _model(self) -> type[CacheEntry]:
        if self._cached_model is None:
            self._cached_model = db_rows.lock_model()
        return self._cached_model


def _let_go_if_dead(alias: str) -> None:
    """After a failed acquisition, close ``alias``'s connection if it died (a lost reply).

    Else the thread's next call meets the dead connection ("the connection is
    closed", "server has gone away") although the database is fine. Not in
    a transaction of the caller's (a ``TestCase``'s): that one is the caller's.
    """
    connection = connections[alias]
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()
