"""Leases as rows of the ``cache_entries`` table, in any database Django supports.

Atomicity comes from the primary key: two concurrent inserts of one key cannot
both succeed, so acquisition is an ORM ``create()`` and an ``IntegrityError``
on the key means "held" (once the row is seen to exist). Every time is the
database server's clock in UTC (``UtcNow``, see ``db_functions``), so
neither workers' clocks nor sessions' time zones decide who holds a key.

Statements run in autocommit, one round trip each: acquiring a free key is one
INSERT, releasing is one DELETE, a refresh is one UPDATE. Only an INSERT that
conflicts is followed by a SELECT of the row, which tells "held" from "free to
take over" (expired, or older than 24 h) by the server's clock. A release
with ``min_hold`` is one UPDATE while the hold lasts; a fence is one more
statement (see ``db_fences``).

``QuerySet.delete()`` is avoided on purpose: it wraps itself in a transaction,
and with signal receivers it deletes by primary key after a SELECT, which
could delete a lease taken over in between.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import Error, IntegrityError, connections, transaction
from django.db.models import F, Q
from django.db.models.functions import Least

from django_tasklock.backends import db_statements
from django_tasklock.backends.base import (
    STALE_AFTER,
    BaseBackend,
    HeldLock,
    Holder,
    Refresh,
    caller_key,
    storage_key,
)
from django_tasklock.backends.db_connections import (
    alias_for_writing,
    close_connections,
    in_test_transaction,
    is_key_conflict,
    names_missing_table,
)
from django_tasklock.backends.db_fences import (
    next_fence_in_transaction,
    next_fence_upsert,
    upsert_returns,
)
from django_tasklock.backends.db_functions import AsUtc, UtcNow, aware_utc, in_namespace
from django_tasklock.backends.forksafe import ForkSafeLock
from django_tasklock.backends.retries import retry_on_new_connection, retry_when_busy
from django_tasklock.conf import conf
from django_tasklock.exceptions import TaskLockError

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from django_tasklock.models import CacheEntry

# Attempts at the INSERT when the key keeps changing hands between our INSERT
# and our look at the row (or an abandoned row is taken over).
_ACQUIRE_ATTEMPTS = 5


class DatabaseBackend(BaseBackend):
    """Leases in the ``cache_entries`` table of the database alias ``using``.

    Inside the caller's transaction the lock's statements go through a second
    connection to the same database, opened for them and closed right after,
    so that a lease is committed, and visible to other workers, at once (see
    ``db_connections``). Under a
    Django ``TestCase`` the test's own transaction is used instead, and the
    heartbeat (whose thread cannot see that transaction) leaves such leases
    alone: keep work under a ``TestCase`` shorter than its ``ttl``.
    """

    #: Databases whose fence is one upsert statement (the others: a transaction).
    single_statement_fence_vendors: tuple[str, ...] = ("postgresql", "sqlite")

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self._test_leases: set[tuple[str, str]] = set()
        self._test_leases_lock = ForkSafeLock()
        self._cached_model: type[CacheEntry] | None = None
        # Per alias, the release DELETEs (live rows, any row), compiled once.
        self._releases: dict[str, tuple[db_statements.Release, db_statements.Release]] = {}
        self._lease_lengths: dict[timedelta, Any] = {}  # UtcNow() + length, built once

    @classmethod
    def from_settings(cls) -> DatabaseBackend:
        return cls(using=conf.DATABASE)

    @classmethod
    def check(cls) -> list[Any]:
        """E006: ``TASKLOCK_DATABASE`` is not a database alias.

        A missing ``"django_tasklock"`` in ``INSTALLED_APPS`` cannot be reported
        here (without the app nothing registers these checks): first use raises
        ``ImproperlyConfigured`` naming ``INSTALLED_APPS`` instead.
        """
        errors: list[Any] = []
        if conf.DATABASE not in settings.DATABASES:
            errors.append(
                checks.Error(
                    f"TASKLOCK_DATABASE = {conf.DATABASE!r} is not a database alias.",
                    hint=f"Use one of: {', '.join(settings.DATABASES)}.",
                    id="django_tasklock.E006",
                )
            )
        elif _is_sqlite_with_atomic_requests(conf.DATABASE):
            errors.append(
                checks.Warning(
                    f"ATOMIC_REQUESTS is on for the SQLite database {conf.DATABASE!r} that "
                    "holds the task locks: every view taking a lock (@exclusive) fails, "
                    "because SQLite has one writer and the view's transaction is it.",
                    hint="Mark those views @transaction.non_atomic_requests, or keep the "
                    "locks elsewhere: TASKLOCK_DATABASE naming another database, or "
                    "TASKLOCK_BACKEND = 'redis'.",
                    id="django_tasklock.W001",
                )
            )
        return errors

    # -- the contract ------------------------------------------------------

    @names_missing_table
    @retry_when_busy
    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        with alias_for_writing(self.using) as alias:
            return self._acquire(alias, storage_key(key), token, ttl, max_lifetime)

    def _acquire(
        self, alias: str, stored: str, token: str, ttl: timedelta, max_lifetime: timedelta
    ) -> bool:
        model = self._model()
        for _ in range(_ACQUIRE_ATTEMPTS):
            try:
                with _savepoint_if_in_transaction(alias):
                    model.objects.using(alias).create(
                        key=stored,
                        value=token,
                        expires_at=self._ends_in(min(ttl, max_lifetime)),
                        created_at=UtcNow(),
                    )
            except IntegrityError as exc:
                # "Held" only once the row is seen; one look also says whether
                # it is free to take over, by the server's clock.
                row = (
                    model.objects.using(alias)
                    .filter(key=stored)
                    .values_list(
                        "value", AsUtc("expires_at"), AsUtc("created_at"), AsUtc(UtcNow())
                    )
                    .first()
                )
                if row is None:
                    if not is_key_conflict(exc):
                        raise  # not a key conflict after all: a real error
                    continue  # the holder released between our INSERT and our look
                holder = row[0]
                expires_at, created_at, now = (aware_utc(moment) for moment in row[1:])
                if expires_at > now and created_at > now - STALE_AFTER:
                    return False
                # Expired or abandoned: delete that holder's row (a token is
                # never reused, so a new holder's row is safe) and insert again.
                # The DELETE judges staleness again, by the server's clock: the
                # holder's refresh may have extended the row since our look.
                self._stale(alias).filter(key=stored, value=holder)._raw_delete(alias)
            else:
                if in_test_transaction(connections[alias]):
                    with self._test_leases_lock:
                        self._test_leases.add((stored, token))
                return True
        # The key changed hands at every attempt: it was held each time we asked.
        return False

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

        Runs under a statement timeout (``db_statements.REFRESH_TIMEOUT``, 5 s):
        on PostgreSQL in the same query, elsewhere set once on the calling
        thread's connection, the heartbeat's own (see ``bound_refreshes``).
        """
        stored = [storage_key(item.key) for item in items]
        in_test = self._test_leases
        rows = [
            (key, item.token, item.ttl, item.max_lifetime)
            for key, item in zip(stored, items, strict=True)
            if not in_test or (key, item.token) not in in_test
        ]
        ours: set[tuple[str, str]] = set()
        if rows:
            model = self._model()
            with alias_for_writing(self.using) as alias:
                try:
                    ours = db_statements.refresh(model, alias, rows)
                except Error:
                    # A killed or dropped connection: let the next attempt open a new one.
                    connections[alias].close_if_unusable_or_obsolete()
                    raise
        if in_test:
            with self._test_leases_lock:
                ours |= self._test_leases
        return [(key, item.token) in ours for key, item in zip(stored, items, strict=True)]

    @names_missing_table
    @retry_on_new_connection
    @retry_when_busy
    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        stored = storage_key(key)
        if self._test_leases:
            with self._test_leases_lock:
                self._test_leases.discard((stored, token))
        with alias_for_writing(self.using) as alias:
            if min_hold is not None:
                # Held until created_at + min_hold, by the server's clock: cut the
                # lease to end then, while that is still ahead; else delete it.
                ours = self._model().objects.using(alias).filter(key=stored, value=token)
                young = ours.filter(expires_at__gt=UtcNow(), created_at__gt=UtcNow() - min_hold)
                if young.update(expires_at=F("created_at") + min_hold):
                    return True
            live, any_row = self._release_statements(alias)
            if live.run(alias, stored, token):
                return True
            # Not live: lost. Still clear our own expired row, if it is there.
            any_row.run(alias, stored, token)
            return False

    @names_missing_table
    @retry_when_busy  # not on a new connection: a fence sent twice would count twice
    def fence(self, key: str, token: str) -> int | None:
        """Increment ``tasklock_fences`` for ``key`` while ``token`` holds the live row.

        One statement on PostgreSQL and SQLite, a short transaction elsewhere
        (see ``db_fences``).
        """
        with alias_for_writing(self.using) as alias:
            held = (
                self._model()
                .objects.using(alias)
                .filter(key=storage_key(key), value=token, expires_at__gt=UtcNow())
                .filter(created_at__gt=UtcNow() - STALE_AFTER)
            )
            connection = connections[alias]
            if connection.vendor in self.single_statement_fence_vendors and upsert_returns(
                connection
            ):
                return next_fence_upsert(alias, key, held)
            return next_fence_in_transaction(alias, key, held)

    @names_missing_table
    @retry_on_new_connection
    @retry_when_busy
    def force_release(self, key: str) -> bool:
        with alias_for_writing(self.using) as alias:
            return bool(
                self._model().objects.using(alias).filter(key=storage_key(key))._raw_delete(alias)
            )

    @names_missing_table
    def peek(self, key: str) -> HeldLock | None:
        with self._reading() as alias:
            found = self._live(alias).filter(key=storage_key(key)).first()
        return _held(found) if found is not None else None

    @names_missing_table
    def list(self) -> list[HeldLock]:
        with self._reading() as alias:
            return [_held(row) for row in self._live(alias).order_by("key")]

    @names_missing_table
    @retry_when_busy
    def clear_stale(self, *, dry_run: bool = False) -> int:
        with alias_for_writing(self.using) as alias:
            stale = self._stale(alias)
            return stale.count() if dry_run else db_statements.delete_in_key_order(stale, alias)

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

    def _ends_in(self, length: timedelta) -> Any:
        """``UtcNow() + length``, one expression per length (the ORM copies it to resolve it)."""
        expression = self._lease_lengths.get(length)
        if expression is None:
            if len(self._lease_lengths) > 64:  # callers with ever-new ttls: do not grow
                self._lease_lengths.clear()
            expression = self._lease_lengths[length] = UtcNow() + length
        return expression

    def _model(self) -> type[CacheEntry]:
        if self._cached_model is not None:
            return self._cached_model
        if not apps.is_installed("django_tasklock"):
            raise ImproperlyConfigured(
                'The database backend of django-tasklock needs "django_tasklock" in '
                "INSTALLED_APPS (and manage.py migrate), or choose another TASKLOCK_BACKEND."
            )
        from django_tasklock.models import CacheEntry

        self._cached_model = CacheEntry
        return CacheEntry

    def _live(self, alias: str) -> QuerySet[CacheEntry]:
        return (
            self._model()
            .objects.using(alias)
            .filter(in_namespace(), expires_at__gt=UtcNow())
            .filter(created_at__gt=UtcNow() - STALE_AFTER)
            .annotate(
                utc_created=AsUtc("created_at"),
                utc_expires=AsUtc("expires_at"),
                server_now=AsUtc(UtcNow()),
            )
        )

    @contextmanager
    def _reading(self) -> Iterator[str]:
        """Where to read: as for writing, but SQLite reads in the caller's transaction."""
        side = ExitStack()
        try:
            alias = side.enter_context(alias_for_writing(self.using))
        except TaskLockError:
            alias = self.using
        with side:
            yield alias

    def _stale(self, alias: str) -> QuerySet[CacheEntry]:
        """Rows free to take over: expired, or acquired more than 24 h ago."""
        rows = self._model().objects.using(alias).filter(in_namespace())
        return rows.filter(Q(expires_at__lte=UtcNow()) | Q(created_at__lte=UtcNow() - STALE_AFTER))


def _held(row: CacheEntry) -> HeldLock:
    """The row as the API shows it: times in aware UTC, whatever ``USE_TZ`` is."""
    expires_at = aware_utc(row.utc_expires)  # type: ignore[attr-defined]
    server_now = aware_utc(row.server_now)  # type: ignore[attr-defined]
    return HeldLock(
        key=caller_key(row.key),
        holder=Holder.from_token(row.value),
        acquired_at=aware_utc(row.utc_created),  # type: ignore[attr-defined]
        expires_at=expires_at,
        seconds_left=max(0.0, (expires_at - server_now).total_seconds()),
    )


def _is_sqlite_with_atomic_requests(using: str) -> bool:
    connection = connections[using]  # a wrapper only: nothing connects
    return connection.vendor == "sqlite" and bool(connection.settings_dict["ATOMIC_REQUESTS"])


def _savepoint_if_in_transaction(alias: str) -> AbstractContextManager[Any]:
    """A savepoint where an IntegrityError would otherwise break the open transaction."""
    if connections[alias].in_atomic_block:
        return transaction.atomic(using=alias)
    return nullcontext()
