"""The statement budget, counted where the statements arrive.

PostgreSQL: libpq's trace of the connection (every message the client sends).
Redis: MONITOR, filtered to the backend's own connection. Acquiring a free key
is one statement, a release one, an attempt on a held key at most two, and
refreshing N due leases one per chunk of 500.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connections

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import BaseBackend, Refresh
from django_tasklock.backends.database import DatabaseBackend
from django_tasklock.backends.database.statements import REFRESH_CHUNK
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.testing.support import wait_until
from tests.backends.test_database import _kinds, _statements_sent
from tests.conftest import require_service

pytestmark = pytest.mark.databases

LONG, LIFE = timedelta(seconds=60), timedelta(hours=1)
LEASES = 2 * REFRESH_CHUNK + 200  # three chunks


def _in_own_thread(work: Callable[[], Any]) -> Any:
    """``work()`` on a thread of its own: its own connection, closed afterwards."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:  # pragma: no cover - re-raised below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def test_free_key_held_key_and_release_on_postgres(key: str) -> None:
    require_service("postgres")
    backend = DatabaseBackend(using="postgres")
    token = new_token()
    backend.peek("warm-up")  # connect outside the measurement
    sent = _statements_sent(
        "postgres", lambda: backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    )
    assert _kinds(sent) == ["INSERT"], sent
    refused = _statements_sent(
        "postgres", lambda: backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
    )
    assert len(refused) <= 2, refused
    released = _statements_sent("postgres", lambda: backend.release(key, token))
    assert _kinds(released) == ["DELETE"], released


def test_refreshing_n_leases_is_one_statement_per_chunk_on_postgres(key: str) -> None:
    require_service("postgres")
    backend = DatabaseBackend(using="postgres")
    items = [
        Refresh(f"{key}-{n}", new_token(), ttl=LONG, max_lifetime=LIFE) for n in range(LEASES)
    ]
    for item in items[:-1]:  # the last one is not held: reported lost, not extended
        assert backend.acquire(item.key, item.token, ttl=LONG, max_lifetime=LIFE)
    items.append(Refresh(items[0].key, new_token(), ttl=LONG, max_lifetime=LIFE))  # not ours

    def refresh_traced() -> tuple[list[str], list[bool]]:
        backend.refresh_many(items[:1])  # connects outside the measurement
        answers: list[bool] = []
        sent = _statements_sent("postgres", lambda: answers.extend(backend.refresh_many(items)))
        with connections["postgres"].cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            # The timeout ended with the refresh: nothing leaks to the session
            # (or, behind PgBouncer, to another client's server connection).
            assert cursor.fetchone()[0] == "0"
        return sent, answers

    try:
        sent, answers = _in_own_thread(refresh_traced)
        # One query per chunk: "SET LOCAL statement_timeout ...; UPDATE ...", run by
        # the server as one implicit transaction (the timeout ends with it).
        assert len(sent) == math.ceil(len(items) / REFRESH_CHUNK), sent
        assert all("SET LOCAL statement_timeout" in text for text in sent), sent
        assert all("UPDATE" in text for text in sent), sent
        assert answers == [True] * (LEASES - 1) + [False, False]
    finally:
        for item in items[:-2]:
            backend.release(item.key, item.token)


def test_the_heartbeat_sends_due_leases_in_one_call_per_backend() -> None:
    calls: list[int] = []

    class Counting(MemoryBackend):
        def refresh_many(self, items: Any) -> list[bool]:
            calls.append(len(items))
            return super().refresh_many(items)

    backend = Counting()
    service = TaskLockService(backend)
    release = threading.Event()
    leases = REFRESH_CHUNK // 2
    started = threading.Barrier(leases + 1)

    def hold(n: int) -> None:
        def work() -> None:
            started.wait()
            release.wait()

        service.run_exclusive(f"many-{n}", work, ttl=3, refresh_interval=1)

    threads = [threading.Thread(target=hold, args=(n,)) for n in range(leases)]
    for thread in threads:
        thread.start()
    try:
        started.wait()
        # Leases due within half an interval of each other share a tick; those
        # taken further apart (a slow machine: 250 threads may take several
        # intervals to acquire) join them at a later one, until one call carries
        # them all. How many ticks that takes is the machine's, not asserted.
        wait_until(lambda: leases in calls, timeout=60)
    finally:
        release.set()
        for thread in threads:
            thread.join()
    assert max(calls) == leases  # all in one call, never more than there are


@pytest.fixture
def monitored() -> Iterator[tuple[RedisBackend, Callable[[Callable[[], object]], list[str]]]]:
    require_service("redis")
    # One connection, which pipelines use too: every command comes from one address.
    pool = redis.BlockingConnectionPool.from_url(str(settings.REDIS_URL), max_connections=1)
    client = redis.Redis(connection_pool=pool)
    watcher = redis.Redis.from_url(str(settings.REDIS_URL))

    def commands(work: Callable[[], object]) -> list[str]:
        """The commands ``client`` sent while ``work()`` ran, as MONITOR saw them."""
        address = str(client.client_info()["addr"])
        marker = f"tasklock-audit-{uuid.uuid4().hex}"
        seen: list[str] = []
        with watcher.monitor() as monitor:  # type: ignore[no-untyped-call]
            work()
            client.echo(marker)
            for event in monitor.listen():
                if f"{event.get('client_address')}:{event.get('client_port')}" != address:
                    continue
                if marker in event["command"]:
                    return seen
                seen.append(event["command"].split()[0].upper())
        raise AssertionError("MONITOR ended early")  # pragma: no cover

    yield RedisBackend(client=client), commands
    client.close()
    watcher.close()


def test_free_key_held_key_release_and_refresh_on_redis(
    monitored: tuple[RedisBackend, Callable[[Callable[[], object]], list[str]]], key: str
) -> None:
    backend, commands = monitored
    backend.peek("warm-up")  # loads the scripts outside the measurement
    token = new_token()
    assert commands(lambda: backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)) == [
        "EVALSHA"
    ]
    assert (
        len(commands(lambda: backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE))) <= 2
    )
    items = [Refresh(key, token, ttl=LONG, max_lifetime=LIFE)] * LEASES
    backend.refresh_many(items[:1])  # the first call of a script loads it (SCRIPT LOAD)
    answers: list[bool] = []
    assert commands(lambda: answers.extend(backend.refresh_many(items))) == ["EVALSHA"] * 3
    assert answers == [True] * LEASES
    assert commands(lambda: backend.release(key, token)) == ["EVALSHA"]


def test_a_single_redis_refreshes_500_keys_of_any_slots_in_one_script(
    monitored: tuple[RedisBackend, Callable[[Callable[[], object]], list[str]]], key: str
) -> None:
    """1,200 leases of 1,200 keys (about as many slots): 3 scripts, not one per slot."""
    backend, commands = monitored
    names = [f"{key}:{i}" for i in range(1_200)]
    tokens = [new_token() for _ in names]
    for name, token in zip(names, tokens, strict=True):
        assert backend.acquire(name, token, ttl=LONG, max_lifetime=LIFE)
    items = [
        Refresh(n, t, ttl=LONG, max_lifetime=LIFE) for n, t in zip(names, tokens, strict=True)
    ]
    answers: list[bool] = []
    assert commands(lambda: answers.extend(backend.refresh_many(items))) == ["EVALSHA"] * 3
    assert answers == [True] * len(names)
    for name, token in zip(names, tokens, strict=True):
        backend.release(name, token)


def test_default_refresh_many_loops_over_refresh(key: str) -> None:
    refreshed: list[str] = []

    class SingleOnly(MemoryBackend):
        def refresh(self, key: str, token: str, **kwargs: Any) -> bool:
            refreshed.append(key)
            return super().refresh(key, token, **kwargs)

    backend: BaseBackend = SingleOnly()
    token = new_token()
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    items = [
        Refresh(key, token, ttl=LONG, max_lifetime=LIFE),
        Refresh("gone", token, ttl=LONG, max_lifetime=LIFE),
    ]
    assert backend.refresh_many(items) == [True, False]
    assert refreshed == [key, "gone"]


@pytest.mark.parametrize("alias", ["default", "postgres"], ids=["sqlite", "postgres"])
def test_refresh_many_gives_each_lease_its_own_ttl_and_cap(alias: str, key: str) -> None:
    if alias == "postgres":
        require_service("postgres")
    backend = DatabaseBackend(using=alias)
    short, long_, capped, lost = (f"{key}-{n}" for n in range(4))
    tokens = {name: new_token() for name in (short, long_, capped, lost)}
    for name, token in tokens.items():
        assert backend.acquire(name, token, ttl=timedelta(seconds=10), max_lifetime=LIFE)
    backend.force_release(lost)
    items = [
        Refresh(short, tokens[short], ttl=timedelta(seconds=60), max_lifetime=LIFE),
        Refresh(long_, tokens[long_], ttl=timedelta(seconds=600), max_lifetime=LIFE),
        Refresh(
            capped, tokens[capped], ttl=timedelta(seconds=600), max_lifetime=timedelta(seconds=20)
        ),
        Refresh(lost, tokens[lost], ttl=timedelta(seconds=60), max_lifetime=LIFE),
    ]
    try:
        assert backend.refresh_many(items) == [True, True, True, False]
        left = {name: backend.peek(name) for name in (short, long_, capped)}
        assert 50 < left[short].seconds_left <= 60  # type: ignore[union-attr]
        assert 590 < left[long_].seconds_left <= 600  # type: ignore[union-attr]
        assert 10 < left[capped].seconds_left <= 20  # type: ignore[union-attr]
        assert backend.peek(lost) is None
    finally:
        for name in (short, long_, capped):
            backend.release(name, tokens[name])
