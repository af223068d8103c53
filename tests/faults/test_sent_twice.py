"""Every lock call sent twice has the outcome of sending it once.

A reply lost after the storage acted makes the call go out again: the
database backend re-sends a release (or a force release's deletion) on a new
connection, and redis-py retries a command whose connection broke. Through a
:class:`FaultProxy` that lets the request through and drops the connection
before the reply arrives, on PostgreSQL, MariaDB and Redis.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import DatabaseError

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import BaseBackend, lease_id, storage_key
from django_tasklock.locking.lock import Lock
from django_tasklock.signals import lock_lost, lock_released
from django_tasklock.testing.proxy import FaultProxy
from django_tasklock.testing.support import LIFE, LONG, SignalRecorder, wait_until
from tests.support import proxied
from tests.support.proxied import proxied_backend, statement_of

# The fixtures (see tests/support/proxied.py).
storage, proxy, direct = proxied.storage, proxied.proxy, proxied.direct

pytestmark = pytest.mark.databases


def a_write_of(storage: str, backend: BaseBackend, key: str) -> Callable[[bytes], bool]:
    """The request that deletes ``key``: its DELETE, or any Redis command on it but a look."""
    if storage != "redis":
        return lambda data: b"DELETE" in data and b"cache_entries" in data
    inspect = statement_of(storage, backend, "inspect", b"")
    stored = storage_key(key).encode()
    return lambda data: stored in data and inspect not in data


def successor_after_the_drop(
    proxy: FaultProxy, direct: BaseBackend, key: str, successor: str
) -> tuple[threading.Thread, list[bool]]:
    """A thread that, once the proxy has dropped a reply, acquires ``key`` for
    ``successor`` directly (while the re-send is delayed); its answer goes in the list."""
    took: list[bool] = []

    def successor_takes() -> None:
        try:
            wait_until(lambda: proxy.dropped == 1, timeout=20)
            took.append(direct.acquire(key, successor, ttl=LONG, max_lifetime=LIFE))
        finally:
            direct.close()  # this thread's connection

    thread = threading.Thread(target=successor_takes)
    thread.start()
    return thread, took


# -- 1. force release ------------------------------------------------------------


def test_force_release_whose_reply_was_lost_never_ends_the_successors_lease(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    first, successor = new_token(), new_token()
    with proxied_backend(storage, proxy) as operator:
        assert direct.acquire(key, first, ttl=LONG, max_lifetime=LIFE)
        deletion = a_write_of(storage, operator, key)
        proxy.drop_reply(match=deletion)
        proxy.delay(2.0, match=deletion)  # the re-send waits while a successor takes the key
        thread, took = successor_after_the_drop(proxy, direct, key, successor)
        released = operator.force_release(key)
        thread.join(30)
    assert took == [True], "the first deletion did not happen, or the successor could not take"
    assert (proxy.dropped, proxy.delayed) == (1, 1), "the deletion was not sent twice"
    held = direct.peek(key)
    assert held is not None, "the re-sent deletion ended the successor's lease"
    assert held.lease == lease_id(successor)
    assert direct.refresh(key, successor, ttl=LONG, max_lifetime=LIFE)
    # The lease the operator's call ended is named, although its reply was lost.
    assert released, "a force release that ended the lease said it ended nothing"
    assert released.lease == lease_id(first)
    assert direct.release(key, successor)


# -- 2. release ------------------------------------------------------------------


@pytest.mark.parametrize("min_hold", [None, 20.0], ids=["release", "min_hold"])
def test_release_whose_reply_was_lost_is_not_a_loss(
    storage: str,
    proxy: FaultProxy,
    direct: BaseBackend,
    key: str,
    min_hold: float | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    signals = SignalRecorder()
    lock_lost.connect(signals, weak=False)
    lock_released.connect(signals, weak=False)
    try:
        with proxied_backend(storage, proxy) as backend:
            # No refresh comes due: the heartbeat's thread does not see the proxied alias.
            lock = TaskLockService(backend).lock(key, ttl=LONG, min_hold=min_hold)
            with caplog.at_level(logging.WARNING, logger="django_tasklock"):
                lock.acquire()
                proxy.drop_reply(match=statement_of(storage, backend, "release", b"task-lock:"))
                lock.release()
    finally:
        lock_lost.disconnect(signals)
        lock_released.disconnect(signals)
    assert proxy.dropped == 1, "the release's reply was not lost"
    assert not lock.lost
    assert "was lost" not in caplog.text
    assert [name for name, _ in signals.sent] == ["released"]
    held = direct.peek(key)
    if min_hold is None:
        assert held is None
    else:  # kept until acquisition + min_hold, by the first send
        assert held is not None
        assert 15 < held.seconds_left <= min_hold


def released_then_sent_again_after_a_successor(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str, successor: str
) -> tuple[Lock, SignalRecorder]:
    """A lock released (the reply lost), the release sent again once ``successor`` took the key."""
    signals = SignalRecorder()
    lock_lost.connect(signals, weak=False)
    lock_released.connect(signals, weak=False)
    try:
        with proxied_backend(storage, proxy) as backend:
            lock = TaskLockService(backend).lock(key, ttl=LONG)
            lock.acquire()
            deletion = statement_of(storage, backend, "release", b"task-lock:")
            proxy.drop_reply(match=deletion)
            proxy.delay(2.0, match=deletion)
            thread, took = successor_after_the_drop(proxy, direct, key, successor)
            lock.release()
            thread.join(30)
    finally:
        lock_lost.disconnect(signals)
        lock_released.disconnect(signals)
    assert took == [True]
    assert (proxy.dropped, proxy.delayed) == (1, 1), "the release was not sent twice"
    return lock, signals


def test_release_sent_again_after_a_successor_took_the_key_is_not_a_loss(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    """The release sent again knows its first sending ended the lease, whoever holds the
    key now (Redis: its tombstone; a database: no operator's record of a force release),
    and leaves the successor's lease alone."""
    successor = new_token()
    lock, signals = released_then_sent_again_after_a_successor(
        storage, proxy, direct, key, successor
    )
    assert not lock.lost, f"a loss invented: {signals.sent}"
    assert [name for name, _ in signals.sent] == ["released"]
    held = direct.peek(key)
    assert held is not None
    assert held.lease == lease_id(successor)
    assert direct.release(key, successor), "the re-sent release ended the successor's lease"


@pytest.mark.parametrize("successor_came", [True, False], ids=["successor", "free"])
def test_release_sent_again_after_a_force_release_is_a_loss(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str, successor_came: bool
) -> None:
    """An operator ended the lease while its holder worked (and a successor took the key,
    or nobody did): the holder's release, sent twice (its first reply lost), finds
    nothing of its own and must not take that for its own first sending's work: a loss."""
    successor = new_token()
    signals = SignalRecorder()
    lock_lost.connect(signals, weak=False)
    try:
        with proxied_backend(storage, proxy) as backend:
            lock = TaskLockService(backend).lock(key, ttl=LONG)
            lock.acquire()
            assert direct.force_release(key) is not None
            if successor_came:
                assert direct.acquire(key, successor, ttl=LONG, max_lifetime=LIFE)
            proxy.drop_reply(match=statement_of(storage, backend, "release", b"task-lock:"))
            lock.release()
    finally:
        lock_lost.disconnect(signals)
    assert proxy.dropped == 1, "the release was not sent twice"
    assert lock.lost, "the operator's release was taken for the holder's own"
    assert [name for name, _ in signals.sent] == ["lost"]
    held = direct.peek(key)
    if not successor_came:
        assert held is None
        return
    assert held is not None
    assert held.lease == lease_id(successor), "the re-sent release ended the successor's lease"
    assert direct.release(key, successor)


@pytest.mark.parametrize("storage", ["postgres", "mariadb"])
def test_min_hold_release_sent_again_after_min_hold_is_not_a_loss(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    """The first sending cut the lease to end at acquisition + ``min_hold``; the
    second arrives once that has passed and finds our own row run out: released."""
    signals = SignalRecorder()
    lock_lost.connect(signals, weak=False)
    lock_released.connect(signals, weak=False)
    try:
        with proxied_backend(storage, proxy) as backend:
            lock = TaskLockService(backend).lock(key, ttl=LONG, min_hold=2.0)
            lock.acquire()
            stored = storage_key(key).encode()
            cut = lambda data: b"UPDATE" in data and stored in data  # noqa: E731
            proxy.drop_reply(match=cut)
            proxy.delay(3.0, match=cut)  # the second sending: min_hold has passed
            lock.release()
    finally:
        lock_lost.disconnect(signals)
        lock_released.disconnect(signals)
    assert (proxy.dropped, proxy.delayed) == (1, 1), "the release was not sent twice"
    assert not lock.lost, f"a loss invented: {signals.sent}"
    assert [name for name, _ in signals.sent] == ["released"]
    assert direct.peek(key) is None


# -- 3. acquire ------------------------------------------------------------------


def test_acquire_whose_reply_was_lost_is_acquired_or_an_error_never_held(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    """Redis: the client runs the script again, which finds its own lease: acquired.
    The database backend does not send an INSERT twice: the caller gets the error,
    and the lease the INSERT made is released by its token (a re-sent INSERT that
    finds its own row is acquired too: the contract's ResendCases)."""
    ran: list[bool] = []
    with proxied_backend(storage, proxy) as backend:
        proxy.drop_reply(match=statement_of(storage, backend, "acquire", b"INSERT"))
        if storage == "redis":
            result = TaskLockService(backend).run_exclusive(
                key, lambda: ran.append(True), ttl=LONG
            )
            assert (result.acquired, ran, result.lost) == (True, [True], False)
        else:
            with pytest.raises(DatabaseError):
                TaskLockService(backend).run_exclusive(key, lambda: ran.append(True), ttl=LONG)
            assert ran == []
    assert proxy.dropped == 1, "the acquisition's reply was not lost"
    assert direct.peek(key) is None, "a lease nobody runs was left behind"


def test_a_permit_whose_commit_reply_was_lost_is_the_same_permit_when_asked_again(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    """The database backend: the caller gets the error; the permit the transaction
    committed is its token's, and asking again with the token answers it, taking
    no second permit. Redis: the client runs the script again, which finds the
    token's permit and answers it."""
    token = new_token()
    terms: dict[str, Any] = {"limit": 2, "ttl": LONG, "max_lifetime": LIFE}
    with proxied_backend(storage, proxy) as backend:
        if storage == "redis":
            proxy.drop_reply(match=statement_of(storage, backend, "permit", b""))
            name = backend.acquire_permit(key, token, **terms)
            assert proxy.dropped == 1, "the script's reply was not lost"
        else:
            proxy.drop_reply(match=b"COMMIT")
            with pytest.raises(DatabaseError):
                backend.acquire_permit(key, token, **terms)
            assert proxy.dropped == 1, "the transaction's reply was not lost"
            name = backend.acquire_permit(key, token, **terms)
    assert name is not None
    held = direct.peek(name)
    assert held is not None
    assert held.lease == lease_id(token)
    other = new_token()
    second = direct.acquire_permit(key, other, **terms)
    assert second is not None  # the first ask took one permit, not two
    assert second != name
    assert direct.release(name, token)
    assert direct.release(second, other)


def test_the_next_acquisition_after_a_lost_reply_runs_on_a_new_connection(
    storage: str, proxy: FaultProxy, direct: BaseBackend, key: str
) -> None:
    """The database backend: an INSERT whose reply was lost raises; the same thread's
    next call must not meet the dead connection (it did: "the connection is closed"
    on PostgreSQL, "Server has gone away" on MariaDB)."""
    if storage == "redis":
        pytest.skip("redis: the client sends the script again itself")
    token = new_token()
    with proxied_backend(storage, proxy) as backend:
        proxy.drop_reply(match=b"INSERT")
        with pytest.raises(DatabaseError):
            backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert proxy.dropped == 1, "the acquisition's reply was not lost"
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)  # its own row: ours
    assert direct.release(key, token)
