"""What only the database backend does for permits: the anchor row, and the statements sent."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models.query import QuerySet

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import caller_key, permit_key, storage_key
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database import permits as db_permits
from django_tasklock.backends.database.permits import anchor_limit
from django_tasklock.exceptions import LimitMismatch
from django_tasklock.models import CacheEntry
from tests.backends.test_database import _kinds, _statements_sent, alias
from tests.conftest import require_service

__all__ = ["alias"]  # the fixture of test_database, used here

pytestmark = [pytest.mark.databases, pytest.mark.django_db(transaction=True, databases="__all__")]

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


def test_a_limited_keys_anchor_row_keeps_its_limit_and_goes_with_the_next_mutex(
    alias: str, key: str
) -> None:
    backend = DatabaseBackend(using=alias)
    token = new_token()
    name = backend.acquire_permit(key, token, limit=3, ttl=LONG, max_lifetime=LIFE)
    assert name == permit_key(key, 0)
    rows = CacheEntry.objects.using(alias)
    assert anchor_limit(rows.get(key=storage_key(key)).value) == 3
    assert rows.get(key=storage_key(name)).value == token
    assert backend.release(name, token)
    assert rows.filter(key=storage_key(key)).exists()  # the anchor stays after its permits

    mutex = new_token()
    assert backend.acquire(key, mutex, ttl=LONG, max_lifetime=LIFE)  # the anchor goes
    assert rows.get(key=storage_key(key)).value == mutex
    assert backend.release(key, mutex)


def test_a_permit_is_one_transaction_of_four_writes_at_most_on_postgres(key: str) -> None:
    """BEGIN, the anchor's lock, one SELECT, the permit and the anchor written, COMMIT."""
    require_service("postgres")
    backend = DatabaseBackend(using="postgres")
    terms = {"limit": 2, "ttl": LONG, "max_lifetime": LIFE}
    backend.peek("warm-up")  # connect outside the measurement
    a, b, c = new_token(), new_token(), new_token()
    first = _statements_sent("postgres", lambda: backend.acquire_permit(key, a, **terms))
    assert _kinds(first) == ["BEGIN", "UPDATE", "SELECT", "INSERT", "INSERT", "COMMIT"], first
    second = _statements_sent("postgres", lambda: backend.acquire_permit(key, b, **terms))
    assert _kinds(second) == ["BEGIN", "UPDATE", "SELECT", "INSERT", "UPDATE", "COMMIT"], second
    refused = _statements_sent("postgres", lambda: backend.acquire_permit(key, c, **terms))
    assert _kinds(refused) == ["BEGIN", "UPDATE", "SELECT", "COMMIT"], refused
    assert backend.release(permit_key(key, 0), a)
    assert backend.release(permit_key(key, 1), b)


# -- interleavings, forced at the statements of ``permits`` ---------------------------------


def _in_thread(
    work: Callable[[], Any], timeout: float = 5.0
) -> tuple[threading.Thread, list[Any]]:
    """``work()`` in another thread (its own connections): its answer or exception, if done."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(work())
        except Exception as exc:  # the answer is what the test reads
            out.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout)
    return thread, out


def test_a_mutex_never_deletes_an_anchor_written_after_its_look(
    alias: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its look saw an anchor of no live permit. Before its lock, the anchor goes (another
    mutex, a sweep); after it found no permit, a permit writes a new anchor of the same
    limit: the mutex and the permit are never both held. (Found by review: the mutex's
    deletion, bound to the value it saw, deleted the new anchor, and both were held.)"""
    backend, other = DatabaseBackend(using=alias), DatabaseBackend(using=alias)
    stored = storage_key(key)
    first = new_token()
    name = backend.acquire_permit(key, first, limit=2, ttl=LONG, max_lifetime=LIFE)
    assert name is not None
    assert backend.release(name, first)  # an anchor of no live permit
    me, permit_token = threading.get_ident(), new_token()
    steps: dict[str, Any] = {}
    real_lock, real_delete = db_permits._lock_anchor, QuerySet._raw_delete

    def ask_for_the_permit() -> None:
        steps["permit"] = _in_thread(
            lambda: other.acquire_permit(key, permit_token, limit=2, ttl=LONG, max_lifetime=LIFE)
        )

    def lock_anchor(*args: Any) -> int:
        if threading.get_ident() == me and "gone" not in steps:
            steps["gone"] = _in_thread(
                lambda: CacheEntry.objects.using(alias).filter(key=stored)._raw_delete(alias)
            )
        return real_lock(*args)

    def raw_delete(self: QuerySet[Any], using: str) -> int:
        if threading.get_ident() == me and "gone" in steps and "permit" not in steps:
            ask_for_the_permit()
        return real_delete(self, using)

    monkeypatch.setattr(db_permits, "_lock_anchor", lock_anchor)
    monkeypatch.setattr(QuerySet, "_raw_delete", raw_delete)
    mutex = new_token()
    try:
        mutex_held: Any = backend.acquire(key, mutex, ttl=LONG, max_lifetime=LIFE)
    except LimitMismatch as refused:
        mutex_held = refused
    monkeypatch.undo()
    if "permit" not in steps:
        ask_for_the_permit()  # the mutex left no window for it: now, while it holds
    thread, answers = steps["permit"]
    thread.join(60)  # on SQLite it waited for the mutex's transaction to end
    [permit] = answers
    assert not (mutex_held is True and permit == permit_key(key, 0)), "both held"
    if mutex_held is True:
        assert backend.release(key, mutex)
    if permit == permit_key(key, 0):
        assert other.release(permit, permit_token)


def test_a_permit_never_joins_permits_of_another_limit_taken_after_its_look(
    alias: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Limit 3's first write finds no anchor (so locks none); then limit 2 writes one and
    releases its permit; after limit 3's look, limit 2 takes slots 0 and 1 and releases
    slot 0: limit 3 never holds beside limit 2's slot 1. (Found by review: its UPDATE of
    the anchor, bound to the value it saw, matched, and both limits were held.)"""
    mine, other = DatabaseBackend(using=alias), DatabaseBackend(using=alias)
    me = threading.get_ident()
    steps: dict[str, Any] = {}
    kept = new_token()
    real_lock, real_look = db_permits._lock_anchor, db_permits._with_liveness

    def two(token: str) -> str:
        name = other.acquire_permit(key, token, limit=2, ttl=LONG, max_lifetime=LIFE)
        assert name is not None
        return name

    def anchor_of_no_permit() -> None:
        token = new_token()
        assert other.release(two(token), token)

    def two_permits_one_left() -> None:
        token = new_token()
        released = two(token)
        two(kept)
        assert other.release(released, token)

    def lock_anchor(*args: Any) -> int:
        locked = real_lock(*args)
        if threading.get_ident() == me and "anchor" not in steps:
            steps["anchor"] = _in_thread(anchor_of_no_permit)
        return locked

    def look(rows: Any) -> Any:
        seen = real_look(rows)
        if threading.get_ident() == me and "permits" not in steps:
            steps["permits"] = _in_thread(two_permits_one_left)
        return seen

    monkeypatch.setattr(db_permits, "_lock_anchor", lock_anchor)
    monkeypatch.setattr(db_permits, "_with_liveness", look)
    token = new_token()
    try:
        three: Any = mine.acquire_permit(key, token, limit=3, ttl=LONG, max_lifetime=LIFE)
    except LimitMismatch as refused:
        three = refused
    monkeypatch.undo()
    rows = CacheEntry.objects.using(alias).filter(key__startswith=storage_key(key))
    values = set(rows.values_list("value", flat=True))
    assert not (kept in values and token in values), "limits 2 and 3 held at once"
    for name, value in rows.values_list("key", "value"):
        if value in (kept, token):
            assert mine.release(caller_key(name), value)
    assert three is None or isinstance(three, (str, LimitMismatch))


def test_the_anchor_outlives_its_newest_permits_cap(alias: str, key: str) -> None:
    """Written after the permit, by a later reading of the server's clock.
    (Found by review: written before, it ended about 1 ms before the permit's cap.)"""
    backend = DatabaseBackend(using=alias)
    token = new_token()
    name = backend.acquire_permit(key, token, limit=2, ttl=LIFE, max_lifetime=LIFE)
    assert name is not None
    rows = CacheEntry.objects.using(alias)
    anchor, permit = rows.get(key=storage_key(key)), rows.get(key=storage_key(name))
    assert anchor.created_at >= permit.created_at
    assert anchor.expires_at >= permit.created_at + LIFE
    assert backend.release(name, token)
