"""Leases as rows of the ``cache_entries`` table, in any database Django supports.

Atomicity comes from the primary key: two concurrent inserts of one key cannot
both succeed, so acquisition is an ORM ``create()`` and an ``IntegrityError``
on the key means "held" (once the row is seen to exist). Every time is the
database server's ``Now()``, so workers' clocks never decide who holds a key.

Statements run in autocommit, one round trip each: acquiring a free key is one
INSERT, releasing is one DELETE, a refresh is one UPDATE; the stale sweep runs
only when an INSERT conflicts. ``QuerySet.delete()`` is avoided on purpose: it
wraps itself in a transaction, and with signal receivers it deletes by primary
key after a SELECT, which could delete a lease taken over in between.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Q
from django.db.models.functions import Least, Now
from django.db.utils import load_backend
from django.utils.connection import ConnectionDoesNotExist

from django_tasklock.backends.base import (
    KEY_PREFIX,
    STALE_AFTER,
    BaseProvider,
    HeldLock,
    Holder,
    caller_key,
    storage_key,
)
from django_tasklock.conf import conf

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from django_tasklock.models import CacheEntry

# An IntegrityError whose row is then not there is retried this many times
# (the holder released in between); after that it is raised as the real error.
_ACQUIRE_ATTEMPTS = 3


class DatabaseProvider(BaseProvider):
    """Leases in the ``cache_entries`` table of the database alias ``using``.

    Inside the caller's ``transaction.atomic()`` the lock's statements go
    through a second connection of the thread to the same database (known
    as ``"<using>__tasklock"``, opened on first need), so that a lease is
    committed, and visible to other workers, at once, whatever the caller's
    transaction later does. It honours ``CONN_MAX_AGE`` like Django's own.
    Under a Django ``TestCase`` the test's own transaction is used instead,
    so that tests see their fixtures and roll everything back.
    """

    def __init__(self, using: str = "default") -> None:
        self.using = using

    @classmethod
    def from_settings(cls) -> DatabaseProvider:
        return cls(using=conf.DATABASE)

    @classmethod
    def check(cls) -> list[Any]:
        errors: list[Any] = []
        if not apps.is_installed("django_tasklock"):
            errors.append(
                checks.Error(
                    "The database backend of django-tasklock needs its cache_entries table.",
                    hint='Add "django_tasklock" to INSTALLED_APPS and run manage.py migrate.',
                    id="django_tasklock.E005",
                )
            )
        if conf.DATABASE not in settings.DATABASES:
            errors.append(
                checks.Error(
                    f"TASKLOCK_DATABASE = {conf.DATABASE!r} is not a database alias.",
                    hint=f"Use one of: {', '.join(settings.DATABASES)}.",
                    id="django_tasklock.E006",
                )
            )
        return errors

    # -- the contract ------------------------------------------------------

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        model, alias, stored = self._model(), self._alias(), storage_key(key)
        for attempt in range(_ACQUIRE_ATTEMPTS):
            try:
                with _savepoint_if_in_transaction(alias):
                    model.objects.using(alias).create(
                        key=stored,
                        value=token,
                        expires_at=Now() + min(ttl, max_lifetime),
                        created_at=Now(),
                    )
                return True
            except IntegrityError:
                if self._stale(alias, stored)._raw_delete(alias):
                    continue  # took over an expired or abandoned row: insert again
                if model.objects.using(alias).filter(key=stored).exists():
                    return False
                if attempt == _ACQUIRE_ATTEMPTS - 1:
                    raise  # not a key conflict after all: a real error
        raise AssertionError("unreachable")  # pragma: no cover

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        alias = self._alias()
        try:
            updated = (
                self._model()
                .objects.using(alias)
                .filter(key=storage_key(key), value=token, expires_at__gt=Now())
                .update(expires_at=Least(Now() + ttl, F("created_at") + max_lifetime))
            )
        except DatabaseError:
            # A killed or dropped connection: let the next attempt open a new one.
            connections[alias].close_if_unusable_or_obsolete()
            raise
        return updated == 1

    def release(self, key: str, token: str) -> bool:
        alias = self._alias()
        ours = self._model().objects.using(alias).filter(key=storage_key(key), value=token)
        if ours.filter(expires_at__gt=Now())._raw_delete(alias):
            return True
        # Not live: lost. Still clear our own expired row, if it is there.
        ours._raw_delete(alias)
        return False

    def force_release(self, key: str) -> bool:
        alias = self._alias()
        return bool(
            self._model().objects.using(alias).filter(key=storage_key(key))._raw_delete(alias)
        )

    def peek(self, key: str) -> HeldLock | None:
        found = self._live().filter(key=storage_key(key)).first()
        return _held(found) if found is not None else None

    def list(self) -> list[HeldLock]:
        return [_held(row) for row in self._live().order_by("key")]

    def clear_stale(self, *, dry_run: bool = False) -> int:
        alias = self._alias()
        stale = self._stale(alias, None)
        return stale.count() if dry_run else stale._raw_delete(alias)

    def close(self) -> None:
        for alias in (self.using, self._side_alias):
            connection = getattr(_this_thread(), alias, None)
            if connection is not None:
                connection.close()

    # -- helpers -----------------------------------------------------------

    @property
    def _side_alias(self) -> str:
        return f"{self.using}__tasklock"

    def _alias(self) -> str:
        """The alias to run on: ours, unless that would join the caller's transaction."""
        connection = connections[self.using]
        if not connection.in_atomic_block or getattr(
            connection.atomic_blocks[0], "_from_testcase", False
        ):
            return self.using
        side = self._side_alias
        try:
            side_connection = connections[side]
        except ConnectionDoesNotExist:
            side_connection = _independent_connection(connection, side)
        # Honour CONN_MAX_AGE and drop a broken connection, as Django does per request.
        side_connection.close_if_unusable_or_obsolete()
        return side

    def _model(self) -> type[CacheEntry]:
        if not apps.is_installed("django_tasklock"):
            raise ImproperlyConfigured(
                'The database backend of django-tasklock needs "django_tasklock" in '
                "INSTALLED_APPS (and manage.py migrate), or choose another TASKLOCK_BACKEND."
            )
        from django_tasklock.models import CacheEntry

        return CacheEntry

    def _live(self) -> QuerySet[CacheEntry]:
        return (
            self._model()
            .objects.using(self._alias())
            .filter(key__startswith=KEY_PREFIX, expires_at__gt=Now())
            .filter(created_at__gt=Now() - STALE_AFTER)
            .annotate(server_now=Now())
        )

    def _stale(self, alias: str, stored: str | None) -> QuerySet[CacheEntry]:
        """Rows free to take over: expired, or acquired more than 24 h ago."""
        rows = self._model().objects.using(alias).filter(key__startswith=KEY_PREFIX)
        if stored is not None:
            rows = rows.filter(key=stored)
        return rows.filter(Q(expires_at__lte=Now()) | Q(created_at__lte=Now() - STALE_AFTER))


def _held(row: CacheEntry) -> HeldLock:
    server_now = row.server_now  # type: ignore[attr-defined]
    return HeldLock(
        key=caller_key(row.key),
        holder=Holder.from_token(row.value),
        acquired_at=row.created_at,
        expires_at=row.expires_at,
        seconds_left=max(0.0, (row.expires_at - server_now).total_seconds()),
    )


def _independent_connection(connection: BaseDatabaseWrapper, alias: str) -> BaseDatabaseWrapper:
    """A second connection of this thread to ``connection``'s database, known as ``alias``.

    Deliberately not added to ``DATABASES``: test runners then neither create,
    flush nor guard it, and ``manage.py`` commands never list it.
    """
    wrapper: BaseDatabaseWrapper = load_backend(
        connection.settings_dict["ENGINE"]
    ).DatabaseWrapper(connection.settings_dict, alias)
    setattr(_this_thread(), alias, wrapper)
    return wrapper


def _this_thread() -> Any:
    """The calling thread's connections, where ``connections[alias]`` looks first."""
    return connections._connections  # type: ignore[attr-defined]


def _savepoint_if_in_transaction(alias: str) -> AbstractContextManager[Any]:
    """A savepoint where an IntegrityError would otherwise break the open transaction."""
    if connections[alias].in_atomic_block:
        return transaction.atomic(using=alias)
    return nullcontext()
