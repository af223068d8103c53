"""Waiters woken by a release in another process (backends/listening.py, and the storages'
``notifications`` / ``signals``): PostgreSQL's ``NOTIFY``, Redis's shard channels.

The holder runs in another process, so no in-process wake-up can end a
waiter's pause. Here a waiter polls (``POLL_PAUSE``) until its storage will
tell it of a release, then sleeps at least half an hour (its backoff made so,
the holder's lease and the wait an hour): a waiter that takes the key within
``PATIENCE`` of the release was woken. No speed is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import storage_key
from django_tasklock.backends.database import notifications
from django_tasklock.locking import waiting
from django_tasklock.testing import ContractBackend
from django_tasklock.testing.support import wait_until
from django_tasklock.testing.workers import BackendRecipe
from tests.conftest import database_backend, redis_backend, require_service
from tests.support.holder import hold_on_command
from tests.support.waiters import in_thread

pytestmark = pytest.mark.databases

HOUR = 3600
HOURS = timedelta(hours=2)
PATIENCE = 60


@pytest.fixture(autouse=True)
def _not_deaf() -> Iterator[None]:
    """A PostgreSQL listener found deaf in an earlier test (a slow probe) is asked again."""
    yield
    for alias in ("postgres", "pgbouncer"):
        notifications.listener_for(alias)._deaf_until = 0.0


@pytest.fixture(params=["postgres", "redis"])
def telling(request: pytest.FixtureRequest, key: str) -> Iterator[ContractBackend]:
    """A backend whose storage tells waiters of releases."""
    if request.param == "postgres":
        require_service("postgres")
        yield database_backend("postgres")
    else:
        require_service("redis")
        yield from redis_backend(key)


class Holder:
    """The holder in another process, told when to end its lease."""

    def __init__(self, recipe: BackendRecipe, key: str, limit: int = 1) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._ours, theirs = ctx.Pipe()
        args = (recipe, key, theirs, limit)
        self.process = ctx.Process(target=hold_on_command, args=args)
        self.process.start()
        assert self._ours.poll(PATIENCE), "the holder never reported"
        assert self._ours.recv() == "acquired"

    def end(self, how: str) -> None:
        self._ours.send(how)
        assert self._ours.poll(PATIENCE), "the holder never ended its lease"
        assert self._ours.recv() == "ended"

    def stop(self) -> None:
        self.process.kill()
        self.process.join(30)


@pytest.fixture
def pauses_told(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A told waiter's pauses last an hour; the list records each pause's ``told``."""
    monkeypatch.setattr(waiting, "FIRST_PAUSE", float(HOUR))
    monkeypatch.setattr(waiting, "MAX_PAUSE", float(HOUR))
    pauses: list[bool] = []
    original = waiting.Backoff.next_pause

    def next_pause(
        backoff: waiting.Backoff, seconds_left: float | None, *, told: bool = False
    ) -> float | None:
        pauses.append(told)
        return original(backoff, seconds_left, told=told)

    monkeypatch.setattr(waiting.Backoff, "next_pause", next_pause)
    return pauses


def _wait_for(service: TaskLockService, key: str, limit: int = 1) -> Callable[[], object]:
    def wait() -> object:
        with service.lock(key, ttl=60, wait=HOUR, limit=limit) as held:
            return not held.lost

    return wait


@pytest.mark.parametrize("how", ["release", "force"])
def test_a_release_in_another_process_wakes_the_waiter(
    telling: ContractBackend, key: str, pauses_told: list[bool], how: str
) -> None:
    service = TaskLockService(telling.backend)
    outcome = _woken_by(telling, key, how, _wait_for(service, key), pauses_told)
    assert outcome == [True], f"not woken by the other process's {how}"


@pytest.mark.parametrize("how", ["release", "force"])
def test_a_permits_release_in_another_process_wakes_the_waiter_of_its_key(
    telling: ContractBackend, key: str, pauses_told: list[bool], how: str
) -> None:
    """``limit=2``: the other process holds both permits and ends one; the waiter gets it."""
    service = TaskLockService(telling.backend)
    wait = _wait_for(service, key, limit=2)
    outcome = _woken_by(telling, key, how, wait, pauses_told, limit=2)
    assert outcome == [True], f"not woken by the other process's {how} of a permit"


def _woken_by(
    telling: ContractBackend,
    key: str,
    how: str,
    wait: Callable[[], object],
    pauses_told: list[bool],
    limit: int = 1,
) -> list[object]:
    """``wait`` in a thread while another process holds ``key``; once it sleeps a told
    pause (an hour), the holder ends its lease by ``how``: what ``wait`` gave within PATIENCE."""
    assert telling.recipe is not None
    holder = Holder(telling.recipe, key, limit)
    try:
        thread, outcome = in_thread(telling, wait)
        wait_until(lambda: True in pauses_told, timeout=PATIENCE)  # asleep for an hour
        holder.end(how)
        thread.join(PATIENCE)
        return outcome
    finally:
        holder.stop()


def test_an_asyncio_waiter_is_woken_by_another_process(
    telling: ContractBackend, key: str, pauses_told: list[bool]
) -> None:
    service = TaskLockService(telling.backend)

    async def wait() -> bool:
        try:
            async with service.lock(key, ttl=60, wait=HOUR) as held:
                return not held.lost
        finally:
            await sync_to_async(telling.backend.close)()  # the ORM thread's connections

    outcome = _woken_by(telling, key, "release", lambda: asyncio.run(wait()), pauses_told)
    assert outcome == [True], "the asyncio waiter was not woken"


def _listener_count(telling: ContractBackend, key: str) -> int:
    """Connections listening for ``key``'s release, as the storage counts them."""
    stored = storage_key(key)
    if telling.name == "redis":
        client = telling.backend._conn()  # type: ignore[attr-defined]
        reply = client.execute_command("PUBSUB", "SHARDNUMSUB", stored)
        return int(reply[-1])  # [channel, subscribers]
    with connections["postgres"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
            "AND objid = (hashtext(%s)::bigint & 4294967295)::oid AND mode = 'ShareLock'",
            [notifications.NAMESPACE, stored],
        )
        (count,) = cursor.fetchone()
    return int(count)


def test_many_waiters_of_a_process_share_one_listening_connection(
    telling: ContractBackend, key: str, pauses_told: list[bool]
) -> None:
    assert telling.recipe is not None
    holder = Holder(telling.recipe, key)
    try:
        service = TaskLockService(telling.backend)
        waiters = [in_thread(telling, _wait_for(service, key)) for _ in range(8)]
        wait_until(lambda: pauses_told.count(True) >= 8, timeout=PATIENCE)
        assert _listener_count(telling, key) == 1  # eight waiters, one connection
        if telling.name == "postgres":
            with connections["postgres"].cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND datname = current_database()",
                    [notifications.APPLICATION_NAME],
                )
                assert cursor.fetchone() == (1,)
        holder.end("release")
        for thread, _ in waiters:
            thread.join(PATIENCE)
        assert [outcome for _, outcome in waiters] == [[True]] * 8
        # The last waiter gone, the connection is closed.
        wait_until(lambda: _listener_count(telling, key) == 0, timeout=PATIENCE)
    finally:
        holder.stop()


def _kill_listener(telling: ContractBackend) -> None:
    """Close the listener's connection from the storage's side."""
    if telling.name == "redis":
        listener = telling.backend._listener  # type: ignore[attr-defined]
        sock = listener._pubsub.connection._sock
        port = sock.getsockname()[1]
        client = telling.backend._conn()  # type: ignore[attr-defined]
        client.execute_command("CLIENT", "KILL", "ADDR", f"127.0.0.1:{port}")
        return
    raw = notifications.listener_for("postgres")._raw
    pid = raw.info.backend_pid if hasattr(raw, "info") else raw.get_backend_pid()
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def _is_ready(telling: ContractBackend, stored: str) -> bool:
    if telling.name == "redis":
        listener = telling.backend._listener  # type: ignore[attr-defined]
    else:
        listener = notifications.listener_for("postgres")
    return listener is not None and bool(listener.is_ready(stored))


def test_a_wake_up_lost_with_the_listening_connection_still_ends_in_acquisition(
    telling: ContractBackend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The default pauses: a lost wake-up costs no more than one of them."""
    assert telling.recipe is not None
    holder = Holder(telling.recipe, key)
    try:
        service = TaskLockService(telling.backend)
        stored = storage_key(key)
        thread, outcome = in_thread(telling, _wait_for(service, key))
        wait_until(lambda: _is_ready(telling, stored), timeout=PATIENCE)
        _kill_listener(telling)
        wait_until(lambda: not _is_ready(telling, stored), timeout=PATIENCE)
        holder.end("release")  # told to nobody: the connection is gone
        thread.join(PATIENCE)
        assert outcome == [True]
        assert "lost its connection" in caplog.text
    finally:
        holder.stop()


def test_waiters_behind_pgbouncer_transaction_pooling_still_acquire(
    key: str, pauses_told: list[bool]
) -> None:
    """``LISTEN`` hears nothing there: found so, and the waiter polls."""
    require_service("postgres")
    require_service("pgbouncer")
    through = database_backend("pgbouncer")
    holder = Holder(database_backend("postgres").recipe, key)  # type: ignore[arg-type]
    try:
        service = TaskLockService(through.backend)
        listener = notifications.listener_for("pgbouncer")
        thread, outcome = in_thread(through, _wait_for(service, key))
        wait_until(lambda: listener._deaf_until > time.monotonic(), timeout=PATIENCE)
        holder.end("release")
        thread.join(PATIENCE)
        assert outcome == [True]
        assert True not in pauses_told  # never told: it polled all along
    finally:
        holder.stop()


def test_the_release_notifies_only_while_a_process_waits(key: str) -> None:
    """Nobody listening for the key, the release sends no ``NOTIFY``; a listener, one."""
    require_service("postgres")
    service = TaskLockService(database_backend("postgres").backend)
    stored = storage_key(key)
    with connections["postgres"].cursor() as cursor:
        cursor.execute(f"LISTEN {notifications.CHANNEL}")  # this connection's own, too
    try:
        with _heard_on(connections["postgres"].connection) as heard, service.lock(key, ttl=60):
            pass
        assert not [told for told in heard if told.startswith(stored)]
        listener = notifications.listener_for("postgres")
        with listener.watch(stored, lambda: None):
            wait_until(lambda: listener.is_ready(stored), timeout=PATIENCE)
            with (
                _heard_on(connections["postgres"].connection) as heard,
                service.lock(key, ttl=60),
            ):
                pass
        # It names the one process waiting (its listening connection), to look first.
        told = [told for told in heard if told.startswith(stored)]
        assert told == [f"{stored}{notifications.CHOSEN}{listener._pid}"]
    finally:
        with connections["postgres"].cursor() as cursor:
            cursor.execute(f"UNLISTEN {notifications.CHANNEL}")


def test_a_release_that_chose_another_waiting_process_still_wakes_this_one(
    key: str, pauses_told: list[bool]
) -> None:
    """PostgreSQL: a release names one waiting process to look first; the others look
    :data:`notifications.LOOK_LATER` after (that one may have stopped waiting)."""
    require_service("postgres")
    telling = database_backend("postgres")
    stored = storage_key(key)
    assert telling.backend.acquire(key, "someone", ttl=timedelta(hours=1), max_lifetime=HOURS)
    thread, outcome = in_thread(telling, _wait_for(TaskLockService(telling.backend), key))
    wait_until(lambda: True in pauses_told, timeout=PATIENCE)  # asleep for an hour
    with connections["postgres"].cursor() as cursor:
        # The key freed as a release that chose another process (pid 1: not ours) frees it.
        cursor.execute("DELETE FROM cache_entries WHERE key = %s", [stored])
        cursor.execute(
            "SELECT pg_notify(%s, %s)", [notifications.CHANNEL, f"{stored}{notifications.CHOSEN}1"]
        )
    thread.join(PATIENCE)
    assert outcome == [True], "not woken by a release that chose another process"


@contextlib.contextmanager
def _heard_on(raw: Any) -> Iterator[list[str]]:
    """The payloads of notifications ``raw`` receives in the block (and by a round trip after)."""
    heard: list[str] = []
    psycopg3 = hasattr(raw, "pgconn")
    if psycopg3:
        raw.add_notify_handler(lambda notify: heard.append(notify.payload))
    try:
        yield heard
        with connections["postgres"].cursor() as cursor:
            cursor.execute("SELECT 1")
        if not psycopg3:
            heard.extend(notify.payload for notify in raw.notifies)
            raw.notifies.clear()
    finally:
        if psycopg3:
            raw._notify_handlers.clear()
