"""The heartbeat's batch is built once while its leases stay the same, and again when they change.

Ten thousand leases refreshed every second must not be turned into rows and
JSON again at every tick: the heartbeat passes ``refresh_many`` the same
tuple while no lease joins or leaves, and the database backend keeps what it
built from it. A lease released or taken in between must still change the
next refresh, on every database.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from django_tasklock.backends.base import Refresh
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.locking.lock import Lock
from django_tasklock.testing.support import wait_until
from tests.conftest import DATABASE_ALIASES, require_service

pytestmark = pytest.mark.databases

TTL, INTERVAL = 3.0, 0.1


class Recording(DatabaseBackend):
    """The database backend, keeping each ``refresh_many`` argument and answer."""

    def __init__(self, using: str) -> None:
        super().__init__(using=using)
        self.calls: list[tuple[Sequence[Refresh], list[bool]]] = []

    def refresh_many(self, items: Sequence[Refresh]) -> list[bool]:
        answers = super().refresh_many(items)
        self.calls.append((items, answers))
        return answers


@pytest.fixture(params=["default", "postgres", "mariadb"], ids=["sqlite", "postgres", "mariadb"])
def alias(request: pytest.FixtureRequest) -> str:
    if request.param not in DATABASE_ALIASES:
        require_service(request.param)
    return str(request.param)


def _ticks_after(backend: Recording, count: int) -> list[tuple[Sequence[Refresh], list[bool]]]:
    seen = len(backend.calls)
    wait_until(lambda: len(backend.calls) >= seen + count, timeout=20)
    return backend.calls[seen:]


def test_the_batch_is_reused_until_a_lease_leaves_or_joins(alias: str, key: str) -> None:
    backend = Recording(alias)
    locks = [
        Lock(f"{key}-{n}", backend=backend, ttl=TTL, refresh_interval=INTERVAL) for n in range(3)
    ]
    for lock in locks:
        lock.acquire()
    try:
        # Leases acquired a tick apart (a loaded machine) may first tick apart,
        # then join: two ticks of all three in a row, then the same tuple.
        everyone = {lock.key for lock in locks}
        wait_until(
            lambda: (
                len(backend.calls) >= 2
                and all({item.key for item in c[0]} == everyone for c in backend.calls[-2:])
            ),
            timeout=20,
        )
        first, second = backend.calls[-2:]
        assert second[0] is first[0]  # the same tuple: nothing rebuilt
        assert backend._batch is not None
        assert backend._batch.items is second[0]
        assert {item.key for item in second[0]} == {lock.key for lock in locks}
        locks[0].release()
        joined = Lock(f"{key}-new", backend=backend, ttl=TTL, refresh_interval=INTERVAL)
        joined.acquire()
        locks[0] = joined
        # The newcomer may tick alone first; then all three again, in one new tuple.
        wait_until(
            lambda: {item.key for item in backend.calls[-1][0]} == {lock.key for lock in locks},
            timeout=20,
        )
        items, answers = _ticks_after(backend, 1)[-1]
        assert {item.key for item in items} == {lock.key for lock in locks}
        assert answers == [True] * len(items)  # each still held, the newcomer included
        assert items is not first[0]
        assert not any(lock.lost for lock in locks)
    finally:
        for lock in locks:
            if lock.held:
                lock.release()


def test_a_list_is_never_kept(alias: str, key: str) -> None:
    backend = DatabaseBackend(using=alias)
    refresh = Refresh(key, "host:1:nobody", timedelta(seconds=30), timedelta(hours=1))
    assert backend.refresh_many([refresh]) == [False]
    assert backend._batch is None
    assert backend.refresh_many((refresh,)) == [False]
    assert backend._batch is not None


def test_a_lease_taken_after_a_whole_answer_is_still_found_not_ours(alias: str, key: str) -> None:
    """The tuple sent again after an answer of "all ours" (which PostgreSQL's
    answer keeps as the chunk's pairs): a row taken meanwhile is answered False."""
    from django_tasklock.backends.base import storage_key
    from django_tasklock.models import CacheEntry

    backend = DatabaseBackend(using=alias)
    tokens = [f"host:1:token-{n}" for n in range(3)]
    granted = [
        backend.acquire(
            f"{key}-{n}", token, ttl=timedelta(seconds=30), max_lifetime=timedelta(hours=1)
        )
        for n, token in enumerate(tokens)
    ]
    assert granted == [True, True, True]
    items = tuple(
        Refresh(f"{key}-{n}", token, timedelta(seconds=30), timedelta(hours=1))
        for n, token in enumerate(tokens)
    )
    try:
        assert backend.refresh_many(items) == [True, True, True]
        assert backend.refresh_many(items) == [True, True, True]
        CacheEntry.objects.using(alias).filter(key=storage_key(f"{key}-1")).update(
            value="host:2:someone-else"
        )
        assert backend.refresh_many(items) == [True, False, True]
        CacheEntry.objects.using(alias).filter(key=storage_key(f"{key}-1")).update(value=tokens[1])
        assert backend.refresh_many(items) == [True, True, True]
    finally:
        for n, token in enumerate(tokens):
            backend.release(f"{key}-{n}", token)


def _take_over(alias: str, name: str, value: str) -> None:
    from django_tasklock.backends.base import storage_key
    from django_tasklock.models import CacheEntry

    CacheEntry.objects.using(alias).filter(key=storage_key(name)).update(value=value)


def test_an_answer_of_as_many_rows_as_pairs_is_each_pairs_own(alias: str, key: str) -> None:
    """An answer of "all ours" is read from a count of rows: a key sent with two tokens, a pair
    sent twice, or two keys' tokens swapped are still answered lease by lease."""
    backend = DatabaseBackend(using=alias)
    ttl, cap = timedelta(seconds=30), timedelta(hours=1)
    assert backend.acquire(f"{key}-a", "host:1:a", ttl=ttl, max_lifetime=cap)
    assert backend.acquire(f"{key}-b", "host:1:b", ttl=ttl, max_lifetime=cap)
    try:
        two_tokens = (
            Refresh(f"{key}-a", "host:1:a", ttl, cap),
            Refresh(f"{key}-a", "host:1:other", ttl, cap),
        )
        assert backend.refresh_many(two_tokens) == [True, False]
        assert backend.refresh_many(two_tokens) == [True, False]
        twice = (
            Refresh(f"{key}-a", "host:1:a", ttl, cap),
            Refresh(f"{key}-a", "host:1:a", ttl, cap),
            Refresh(f"{key}-none", "host:1:none", ttl, cap),
        )
        assert backend.refresh_many(twice) == [True, True, False]
        swapped = (
            Refresh(f"{key}-a", "host:1:b", ttl, cap),
            Refresh(f"{key}-b", "host:1:a", ttl, cap),
        )
        assert backend.refresh_many(swapped) == [False, False]
    finally:
        backend.release(f"{key}-a", "host:1:a")
        backend.release(f"{key}-b", "host:1:b")


def test_chunks_answered_whole_then_taken_are_answered_per_chunk(
    alias: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of two: after answers of "all ours", a lease taken in one chunk or in
    two is answered False where it was taken, True elsewhere."""
    from django_tasklock.backends.database import statements

    monkeypatch.setattr(statements, "REFRESH_CHUNK", 2)
    backend = DatabaseBackend(using=alias)
    ttl, cap = timedelta(seconds=30), timedelta(hours=1)
    tokens = [f"host:1:t{n}" for n in range(5)]
    for n, token in enumerate(tokens):
        assert backend.acquire(f"{key}-{n}", token, ttl=ttl, max_lifetime=cap)
    items = tuple(Refresh(f"{key}-{n}", token, ttl, cap) for n, token in enumerate(tokens))
    try:
        assert backend.refresh_many(items) == [True] * 5
        assert backend.refresh_many(items) == [True] * 5
        _take_over(alias, f"{key}-3", "host:2:else")
        assert backend.refresh_many(items) == [True, True, True, False, True]
        _take_over(alias, f"{key}-3", tokens[3])
        _take_over(alias, f"{key}-0", "host:2:else")
        _take_over(alias, f"{key}-4", "host:2:else")
        assert backend.refresh_many(items) == [False, True, True, True, False]
        _take_over(alias, f"{key}-0", tokens[0])
        _take_over(alias, f"{key}-4", tokens[4])
        assert backend.refresh_many(items) == [True] * 5
    finally:
        for n, token in enumerate(tokens):
            backend.release(f"{key}-{n}", token)
