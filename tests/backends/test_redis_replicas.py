"""Replica acknowledgement (``min_replicas``): a grant no replica confirmed fails closed.

A private master and replica (``tests/support/replication.py``). A replica stopped
with ``SIGSTOP`` keeps its connection open and acknowledges nothing, as one
that is slow or cut off would: the acquisition raises
``ReplicationNotConfirmed`` (never "held") and the key is free again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_tasklock import LimitMismatch, ReplicationNotConfirmed
from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.scripts import PRELUDE, SCRIPTS
from tests.conftest import runs_manage_py_check
from tests.support import replication
from tests.support.replication import frozen, master_and_replica
from tests.support.servers import PrivateRedis

TIMEOUT = 0.3
LONG = timedelta(seconds=30)
closing = replication.closing  # a fixture
Closing = Callable[[Any], Any]


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[PrivateRedis, PrivateRedis]]:
    with master_and_replica() as running:
        yield running


@pytest.fixture
def master(pair: tuple[PrivateRedis, PrivateRedis], closing: Closing) -> Any:
    return closing(redis.Redis(port=pair[0].port))


@pytest.fixture
def replica(pair: tuple[PrivateRedis, PrivateRedis]) -> PrivateRedis:
    return pair[1]


@pytest.fixture
def backend(pair: tuple[PrivateRedis, PrivateRedis], closing: Closing) -> RedisBackend:
    backend = RedisBackend(url=pair[0].url, min_replicas=1, replica_timeout=TIMEOUT)
    return closing(backend)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"min_replicas": True}, TypeError, "min_replicas"),
        ({"min_replicas": 1.0}, TypeError, "min_replicas"),
        ({"min_replicas": "1"}, TypeError, "min_replicas"),
        ({"min_replicas": -1}, ValueError, "min_replicas"),
        ({"replica_timeout": 0}, ValueError, "replica_timeout"),
        ({"replica_timeout": -1}, ValueError, "replica_timeout"),
        ({"replica_timeout": float("nan")}, ValueError, "replica_timeout"),
        ({"replica_timeout": timedelta(microseconds=10)}, ValueError, "replica_timeout"),
        ({"replica_timeout": "1"}, TypeError, "replica_timeout"),
    ],
)
def test_bad_options_are_refused_naming_the_option(
    options: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        RedisBackend(url="redis://127.0.0.1:1/0", **options)


@runs_manage_py_check
@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"TASKLOCK_REDIS_MIN_REPLICAS": "one"}, "TASKLOCK_REDIS_MIN_REPLICAS"),
        ({"TASKLOCK_REDIS_MIN_REPLICAS": -2}, "TASKLOCK_REDIS_MIN_REPLICAS"),
        ({"TASKLOCK_REDIS_REPLICA_TIMEOUT": 0}, "TASKLOCK_REDIS_REPLICA_TIMEOUT"),
        ({"TASKLOCK_REDIS_REPLICA_TIMEOUT": "1s"}, "TASKLOCK_REDIS_REPLICA_TIMEOUT"),
    ],
)
def test_bad_settings_are_a_check_error_and_improperly_configured_naming_them(
    settings: dict[str, Any], named: str
) -> None:
    # Nothing listens on port 1: the errors come before any connection.
    with override_settings(
        TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL="redis://127.0.0.1:1/0", **settings
    ):
        with pytest.raises(ImproperlyConfigured, match=named):
            RedisBackend.from_settings()
        with pytest.raises(SystemCheckError, match=rf"E011.*{named}"):
            call_command("check")


def test_the_settings_reach_the_backend(
    pair: tuple[PrivateRedis, PrivateRedis], closing: Closing
) -> None:
    with override_settings(
        TASKLOCK_REDIS_URL=pair[0].url,
        TASKLOCK_REDIS_MIN_REPLICAS=2,  # there is one replica
        TASKLOCK_REDIS_REPLICA_TIMEOUT=timedelta(milliseconds=200),
    ):
        backend = closing(RedisBackend.from_settings())
    with pytest.raises(ReplicationNotConfirmed) as raised:
        backend.acquire("t-settings", new_token(), ttl=LONG, max_lifetime=LONG)
    assert (raised.value.wanted, raised.value.confirmed) == (2, 1)
    assert raised.value.timeout == timedelta(milliseconds=200)


def test_a_live_replica_confirms_every_grant_before_it_is_reported(
    backend: RedisBackend, replica: PrivateRedis, key: str, closing: Closing
) -> None:
    seen_on_replica: Any = closing(redis.Redis(port=replica.port))
    service = TaskLockService(backend)
    for _ in range(20):
        with service.lock(key, ttl=30, fencing=True) as held:
            assert held.fence is not None
            # WAIT returned only once the replica had the lease.
            assert seen_on_replica.get(storage_key(key)) is not None
    assert service.run_exclusive(key, lambda: "ran").result == "ran"


def test_a_stopped_replica_fails_the_acquisition_closed_and_leaves_the_key_free(
    backend: RedisBackend, master: Any, replica: PrivateRedis, key: str
) -> None:
    service = TaskLockService(backend)
    with frozen(replica):
        with (
            pytest.raises(ReplicationNotConfirmed, match=key) as raised,
            service.lock(key, ttl=30),
        ):
            pytest.fail("entered a lock no replica confirmed")
        assert (raised.value.wanted, raised.value.confirmed) == (1, 0)
        assert raised.value.released
        assert master.get(storage_key(key)) is None
        # run_exclusive raises too: never acquired=False, never "held".
        with pytest.raises(ReplicationNotConfirmed):
            service.run_exclusive(key, lambda: None)
        assert master.get(storage_key(key)) is None
    assert service.run_exclusive(key, lambda: "after").result == "after"


def test_a_stopped_replica_fails_the_fence_closed(
    backend: RedisBackend, master: Any, replica: PrivateRedis, key: str
) -> None:
    token = new_token()
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LONG)
    with frozen(replica), pytest.raises(ReplicationNotConfirmed):
        backend.fence(key, token)
    assert master.get(storage_key(key)) is None


def test_a_re_sent_acquisition_is_confirmed_only_once_its_first_write_is(
    backend: RedisBackend, master: Any, replica: PrivateRedis, key: str
) -> None:
    # The first send granted the lease and its reply was lost; the replica has
    # not acknowledged that write. The re-send finds its own token: its WAIT,
    # on a connection whose own last write was acknowledged, must still wait
    # for the first send's write.
    token = new_token()
    assert backend.acquire(key + "-before", new_token(), ttl=LONG, max_lifetime=LONG)
    with frozen(replica):
        acquire = master.register_script(PRELUDE + SCRIPTS["acquire"])
        assert acquire(keys=[storage_key(key)], args=[token, 30_000, 86_400_000]) == 1
        with pytest.raises(ReplicationNotConfirmed):
            backend.acquire(key, token, ttl=LONG, max_lifetime=LONG)
        assert master.get(storage_key(key)) is None


def test_a_refusal_sends_no_wait(
    backend: RedisBackend, master: Any, replica: PrivateRedis, key: str
) -> None:
    # A refused acquisition or fence wrote nothing: a WAIT after it would only
    # wait, the whole timeout while a replica is down. A grant, even one sent
    # again that finds its own lease, still waits (see the test above).
    def waits() -> int:
        return int(master.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))

    token = new_token()
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LONG)
    before = waits()
    with frozen(replica):
        assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LONG)  # held
        assert backend.fence(key, new_token()) is None  # not the holder's
    assert waits() == before
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LONG)  # sent again: its own
    assert waits() == before + 1
    assert backend.release(key, token)


def test_a_permits_refusal_sends_no_wait(
    backend: RedisBackend, master: Any, replica: PrivateRedis, key: str
) -> None:
    """All permits held (by this machine's live holders: the script names them), another
    limit, a mutex meeting the permits: nothing written, no WAIT (it sent one each)."""

    def waits() -> int:
        return int(master.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))

    tokens = [new_token(), new_token()]
    names = [backend.acquire_permit(key, t, limit=2, ttl=LONG, max_lifetime=LONG) for t in tokens]
    assert None not in names
    before = waits()
    with frozen(replica):
        assert (
            backend.acquire_permit(key, new_token(), limit=2, ttl=LONG, max_lifetime=LONG) is None
        )
        with pytest.raises(LimitMismatch):
            backend.acquire_permit(key, new_token(), limit=3, ttl=LONG, max_lifetime=LONG)
        with pytest.raises(LimitMismatch):
            backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LONG)
    assert waits() == before
    for name, token in zip(names, tokens, strict=True):
        assert name is not None
        assert backend.release(name, token)


def test_a_lease_that_ran_out_during_the_wait_is_not_said_released(
    backend: RedisBackend, master: Any, replica: PrivateRedis, key: str
) -> None:
    # The WAIT (0.3 s) outlasts the lease (0.1 s): the release by its token
    # finds nothing, so it released nothing, and the error must not say it did.
    short = timedelta(milliseconds=100)
    with frozen(replica), pytest.raises(ReplicationNotConfirmed) as raised:
        backend.acquire(key, new_token(), ttl=short, max_lifetime=LONG)
    assert not raised.value.released
    assert "expires after its ttl" in str(raised.value)
    assert master.get(storage_key(key)) is None


def test_a_lost_wait_reply_is_an_error_and_the_key_is_freed(
    pair: tuple[PrivateRedis, PrivateRedis],
    master: Any,
    replica: PrivateRedis,
    key: str,
    closing: Closing,
) -> None:
    backend = closing(RedisBackend(url=pair[0].url, min_replicas=1, replica_timeout=10))
    killed: list[int] = []

    def kill_the_waiting_connection() -> None:
        end = time.monotonic() + 10
        while time.monotonic() < end and not killed:
            for client in master.client_list():
                if client["cmd"] == "wait":
                    master.client_kill_filter(_id=client["id"])
                    killed.append(int(client["id"]))
            time.sleep(0.01)

    killer = threading.Thread(target=kill_the_waiting_connection)
    with frozen(replica):
        killer.start()
        with pytest.raises(redis.ConnectionError), TaskLockService(backend).lock(key, ttl=30):
            pytest.fail("entered a lock whose WAIT never answered")
        killer.join()
        assert killed
        # The lock released the lease by its token: an error, not a key left held.
        assert master.get(storage_key(key)) is None


def test_a_failed_release_after_a_failed_wait_says_the_lease_expires(
    pair: tuple[PrivateRedis, PrivateRedis],
    master: Any,
    replica: PrivateRedis,
    key: str,
    closing: Closing,
) -> None:
    url = pair[0].url + "?socket_timeout=1.5"  # longer than the WAIT
    backend = closing(RedisBackend(url=url, min_replicas=1, replica_timeout=0.5))
    paused: list[bool] = []

    def pause_writes_during_the_wait() -> None:
        end = time.monotonic() + 10
        while time.monotonic() < end and not paused:
            if any(client["cmd"] == "wait" for client in master.client_list()):
                master.client_pause(3000, all=False)  # writes (the release) wait 3 s
                paused.append(True)
            time.sleep(0.01)

    pauser = threading.Thread(target=pause_writes_during_the_wait)
    with frozen(replica):
        pauser.start()
        with pytest.raises(ReplicationNotConfirmed, match="expires after its ttl") as raised:
            backend.acquire(key, new_token(), ttl=timedelta(seconds=4), max_lifetime=LONG)
        pauser.join()
    assert paused
    assert not raised.value.released
    master.client_unpause()
    assert master.get(storage_key(key)) is not None  # left to its ttl
    assert 0 < master.pttl(storage_key(key)) <= 4000


def test_a_master_that_refuses_the_write_raises_its_error_never_held(
    backend: RedisBackend, master: Any, key: str
) -> None:
    master.config_set("maxmemory", 1)  # noeviction: every write is refused (OOM)
    try:
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LONG)
    finally:
        master.config_set("maxmemory", 0)
    assert master.get(storage_key(key)) is None


def test_the_async_api_raises_it_too(
    backend: RedisBackend, master: Any, replica: PrivateRedis, key: str
) -> None:
    async def work() -> str:
        return "ran"

    service = TaskLockService(backend)
    with frozen(replica), pytest.raises(ReplicationNotConfirmed):
        asyncio.run(service.arun_exclusive(key, work))
    assert master.get(storage_key(key)) is None
    assert asyncio.run(service.arun_exclusive(key, work)).result == "ran"
