"""What only the Redis backend does: the raw key, its TTL and value, connections, scripts.

Every test writes keys that carry its unique ``key`` and deletes only those.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

import django_tasklock
from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends import get_backend, reset_backend
from django_tasklock.backends.base import KEY_PREFIX, Released, storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.replies import text
from django_tasklock.backends.redis.scripts import RELEASED_PREFIX, tombstone_key
from django_tasklock.checks import check_tasklock_settings
from django_tasklock.testing.support import wait_until
from tests.conftest import require_service
from tests.support.servers import private_redis

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _url() -> str:
    url = django_settings.REDIS_URL
    assert isinstance(url, str)
    return url


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.fixture
def raw(key: str) -> Iterator[redis.Redis]:
    """A plain client on the test database; deletes every key carrying ``key`` afterwards."""
    require_service("redis")
    client = redis.Redis.from_url(_url())
    yield client
    mine = list(client.scan_iter(match=f"*{key}*", count=1000))
    for start in range(0, len(mine), 500):
        client.delete(*mine[start : start + 500])
    client.close()


@pytest.fixture
def backend(raw: redis.Redis) -> RedisBackend:
    return RedisBackend(url=_url())


def _ours(client: redis.Redis, key: str) -> set[str]:
    """The keys carrying ``key``, but a release's tombstone (see the test below)."""
    found = {k.decode() for k in client.scan_iter(match=f"*{key}*")}
    return {k for k in found if not k.startswith(RELEASED_PREFIX)}


def test_release_leaves_only_a_short_lived_tombstone_of_its_own_token(
    raw: redis.Redis, backend: RedisBackend, key: str
) -> None:
    token = new_token()
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    assert backend.release_outcome(key, token) is Released.RELEASED
    tombstone = tombstone_key(key, token)
    assert {k.decode() for k in raw.scan_iter(match=f"*{key}*")} == {tombstone}
    assert 0 < raw.pttl(tombstone) <= 60_000
    # Sent again (its reply lost): this release ended it, not a loss.
    assert backend.release_outcome(key, token) is Released.GONE
    # Gone without this release ending it: expired, force-released, evicted.
    other = new_token()
    assert backend.acquire(key, other, ttl=LONG, max_lifetime=LIFE)
    assert backend.force_release(key) is not None
    assert backend.release_outcome(key, other) is Released.LOST
    assert backend.release_outcome(key, token) is Released.GONE, "another lease's end is not ours"
    # With min_hold: cut to end later, then sent again once that has passed.
    held, hold = new_token(), timedelta(seconds=0.3)
    assert backend.acquire(key, held, ttl=LONG, max_lifetime=LIFE)
    assert backend.release_outcome(key, held, min_hold=hold) is Released.RELEASED
    wait_until(lambda: backend.peek(key) is None, timeout=3)
    assert backend.release_outcome(key, held, min_hold=hold) is Released.GONE


# -- the stored key -----------------------------------------------------------------


def test_hold_is_one_key_with_the_lease_ttl_and_a_dated_token(
    raw: redis.Redis, backend: RedisBackend, key: str
) -> None:
    stored = KEY_PREFIX + key
    before_ms = _server_ms(raw)

    def work() -> tuple[set[str], int, str, int]:
        value = raw.get(stored)
        assert isinstance(value, bytes)
        return _ours(raw, key), int(raw.pttl(stored)), value.decode(), _server_ms(raw)

    result = TaskLockService(backend).run_exclusive(key, work, ttl=5)
    assert result.acquired
    assert result.result is not None
    keys, pttl, value, inside_ms = result.result
    assert keys == {stored}
    assert 0 < pttl <= 5000
    # "<token>@<acquired_ms>", the token naming this host and pid, dated by the server.
    token, _, acquired_ms = value.rpartition("@")
    host, pid, secret = token.rsplit(":", 2)
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
    assert len(secret) >= 16
    assert before_ms <= int(acquired_ms) <= inside_ms
    assert _ours(raw, key) == set()


def test_peek_reports_the_acquisition_time_stored_in_the_value(
    raw: redis.Redis, backend: RedisBackend, key: str
) -> None:
    assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
    value = raw.get(storage_key(key))
    assert isinstance(value, bytes)
    held = backend.peek(key)
    assert held is not None
    assert held.acquired_at == EPOCH + timedelta(milliseconds=int(value.rpartition(b"@")[2]))
    assert 0 < held.seconds_left <= 30
    assert held.seconds_left * 1000 >= raw.pttl(storage_key(key)) - 1


def test_first_lease_is_capped_at_max_lifetime(
    raw: redis.Redis, backend: RedisBackend, key: str
) -> None:
    assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=timedelta(seconds=2))
    assert 0 < raw.pttl(storage_key(key)) <= 2000


def test_release_or_refresh_with_a_stale_or_other_token_changes_nothing(
    raw: redis.Redis, backend: RedisBackend, key: str
) -> None:
    stored = storage_key(key)
    stale = new_token()
    assert backend.acquire(key, stale, ttl=timedelta(seconds=0.2), max_lifetime=LIFE)
    wait_until(lambda: raw.exists(stored) == 0, timeout=3)
    current = new_token()
    assert backend.acquire(key, current, ttl=LONG, max_lifetime=LIFE)
    value = raw.get(stored)
    assert isinstance(value, bytes)
    assert value.startswith(current.encode() + b"@")

    assert not backend.release(key, stale)
    assert not backend.release(key, new_token())
    assert not backend.refresh(key, stale, ttl=timedelta(minutes=10), max_lifetime=LIFE)
    assert raw.get(stored) == value
    assert 0 < raw.pttl(stored) <= 30_000  # not extended to the stale holder's 10 min
    assert backend.release(key, current)
    assert raw.exists(stored) == 0


# -- configuration ---------------------------------------------------------------------


def _redis_caches(**redis_options: Any) -> dict[str, Any]:
    configured = dict(django_settings.CACHES)
    configured["redis"] = {**configured["redis"], **redis_options}
    return configured


def test_cache_alias_connection_stores_the_key_without_prefix_or_version(
    raw: redis.Redis, key: str
) -> None:
    with override_settings(
        TASKLOCK_BACKEND="redis",
        TASKLOCK_REDIS_CACHE="redis",
        CACHES=_redis_caches(KEY_PREFIX="pfx", VERSION=7),
    ):
        assert isinstance(get_backend(), RedisBackend)
        result = django_tasklock.run_exclusive(key, lambda: _ours(raw, key), ttl=5)
        assert result.acquired
        assert result.result == {KEY_PREFIX + key}
        # The same cache does apply its prefix and version to its own entries.
        caches["redis"].set(f"{key}-probe", 1, timeout=30)
        assert _ours(raw, key) == {f"pfx:7:{key}-probe"}


def test_redis_url_wins_over_the_cache_alias(raw: redis.Redis, key: str) -> None:
    broken = _redis_caches(LOCATION="redis://127.0.0.1:1/0")
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_CACHE="redis", CACHES=broken):
        # Without the URL the (broken) cache alias is used, and its error is raised...
        with pytest.raises(redis.ConnectionError):
            django_tasklock.run_exclusive(key, lambda: None)
        with override_settings(TASKLOCK_REDIS_URL=_url()):
            # ...with it, the URL.
            result = django_tasklock.run_exclusive(key, lambda: raw.pttl(storage_key(key)))
    assert result.acquired
    assert isinstance(result.result, int)
    assert result.result > 0
    assert raw.exists(storage_key(key)) == 0


def test_environment_variable_chooses_the_backend_when_the_setting_is_absent(
    settings: Any, monkeypatch: pytest.MonkeyPatch, raw: redis.Redis, key: str
) -> None:
    monkeypatch.setenv("TASKLOCK_BACKEND", "redis")
    settings.TASKLOCK_REDIS_URL = _url()
    del settings.TASKLOCK_BACKEND
    reset_backend()  # deleting a setting sends no setting_changed
    assert not hasattr(django_settings, "TASKLOCK_BACKEND")
    assert isinstance(get_backend(), RedisBackend)
    result = django_tasklock.run_exclusive(key, lambda: raw.pttl(storage_key(key)), ttl=5)
    assert result.acquired
    assert isinstance(result.result, int)
    assert 0 < result.result <= 5000
    assert raw.exists(storage_key(key)) == 0


def test_both_environment_variables_switch_to_redis_with_no_setting(
    settings: Any, monkeypatch: pytest.MonkeyPatch, raw: redis.Redis, key: str
) -> None:
    # What the README's Try-it suggests for any project: no CACHES entry, no setting.
    monkeypatch.setenv("TASKLOCK_BACKEND", "redis")
    monkeypatch.setenv("TASKLOCK_REDIS_URL", _url())
    del settings.TASKLOCK_BACKEND
    settings.TASKLOCK_REDIS_CACHE = "absent"
    reset_backend()  # deleting a setting sends no setting_changed
    assert not hasattr(django_settings, "TASKLOCK_REDIS_URL")
    assert check_tasklock_settings() == []
    result = django_tasklock.run_exclusive(key, lambda: raw.exists(storage_key(key)), ttl=5)
    assert (result.acquired, result.result) == (True, 1)


def test_the_setting_wins_over_the_environment_url(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No Redis is needed: the choice of URL is made before anything connects.
    monkeypatch.setenv("TASKLOCK_REDIS_URL", "redis://127.0.0.1:1/0")
    settings.TASKLOCK_REDIS_URL = "redis://127.0.0.1:2/3"
    assert RedisBackend.from_settings()._url == "redis://127.0.0.1:2/3"
    monkeypatch.setenv("TASKLOCK_REDIS_URL", "127.0.0.1:6379")
    del settings.TASKLOCK_REDIS_URL
    with override_settings(TASKLOCK_BACKEND="redis"):
        assert [m.id for m in check_tasklock_settings()] == ["django_tasklock.E009"]


def test_exactly_one_connection_source_and_no_connection_before_use() -> None:
    with pytest.raises(TypeError, match="exactly one"):
        RedisBackend()
    with pytest.raises(TypeError, match="exactly one"):
        RedisBackend(url="redis://127.0.0.1:1/0", cache_alias="redis")
    # Neither connects at construction: only the first call fails.
    unreachable = RedisBackend(url="redis://127.0.0.1:1/0")
    with pytest.raises(redis.ConnectionError):
        unreachable.peek("k")


@pytest.mark.parametrize("alias", ["default", "no-such-cache"])
def test_cache_alias_that_is_not_django_redis_is_improperly_configured_at_first_use(
    alias: str,
) -> None:
    backend = RedisBackend(cache_alias=alias)  # "default" is a LocMemCache in the tests
    ran: list[bool] = []
    with pytest.raises(ImproperlyConfigured, match="TASKLOCK_REDIS_CACHE"):
        TaskLockService(backend).run_exclusive("k", lambda: ran.append(True))
    assert ran == []


def test_capabilities_promise_cross_process_and_server_clock() -> None:
    assert RedisBackend.capabilities.cross_process
    assert RedisBackend.capabilities.server_clock


# -- scripts and SCAN ------------------------------------------------------------------


@pytest.fixture
def flushable() -> Iterator[tuple[redis.Redis, RedisBackend]]:
    """A plain client and a backend on a private server: ``SCRIPT FLUSH`` empties
    every database's scripts, and other test workers share the test Redis."""
    require_service("redis")
    with private_redis() as server:
        client = redis.Redis.from_url(server.url)
        backend = RedisBackend(url=server.url)
        try:
            yield client, backend
        finally:
            backend.close()
            client.close()


def test_every_operation_survives_a_script_cache_flush(
    flushable: tuple[redis.Redis, RedisBackend], key: str
) -> None:
    raw, backend = flushable
    token = new_token()
    assert backend.acquire(key + "-warm", token, ttl=LONG, max_lifetime=LIFE)  # loads scripts
    steps: list[tuple[str, Callable[[], object]]] = [
        ("acquire", lambda: backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)),
        ("refresh", lambda: backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)),
        ("peek", lambda: backend.peek(key) is not None),
        ("list", lambda: [h.key for h in backend.list() if h.key.startswith(key)]),
        ("clear_stale", lambda: backend.clear_stale(dry_run=True) >= 0),
        ("release", lambda: backend.release(key, token)),
        ("release-warm", lambda: backend.release(key + "-warm", token)),
    ]
    outcomes = {}
    for name, step in steps:
        raw.script_flush()
        outcomes[name] = step()
    assert outcomes == {
        "acquire": True,
        "refresh": True,
        "peek": True,
        "list": [key, key + "-warm"],
        "clear_stale": True,
        "release": True,
        "release-warm": True,
    }
    assert _ours(raw, key) == set()


def _command_calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_list_pages_through_scan_and_never_calls_keys(
    raw: redis.Redis, backend: RedisBackend, key: str
) -> None:
    expected = [f"{key}-{i:04d}" for i in range(2000)]
    value = f"{new_token()}@{_server_ms(raw)}"
    pipe = raw.pipeline(transaction=False)
    for name in reversed(expected):
        pipe.set(storage_key(name), value, px=60_000)
    pipe.execute()

    keys_before, scans_before = _command_calls(raw, "keys"), _command_calls(raw, "scan")
    listed = backend.list()
    keys_after, scans_after = _command_calls(raw, "keys"), _command_calls(raw, "scan")

    mine = [held.key for held in listed if held.key.startswith(key)]
    assert mine == expected
    assert [held.key for held in listed] == sorted(held.key for held in listed)
    assert keys_after == keys_before
    assert scans_after - scans_before >= 2  # more than one page


# -- values the backend did not write -----------------------------------------------


def _write_foreign(client: redis.Redis, stored: str, kind: str, px: int | None) -> None:
    if kind == "list":
        client.rpush(stored, "a", "b")
        if px is not None:
            client.pexpire(stored, px)
    else:
        client.set(stored, kind, px=px)


def _dump(client: redis.Redis, stored: str) -> object:
    return client.lrange(stored, 0, -1) if client.type(stored) == b"list" else client.get(stored)


@pytest.mark.parametrize(
    ("kind", "holder"),
    [
        ("garbage", ("?", None)),
        ("otherhost:4242:secret", ("otherhost", 4242)),
        ("list", ("?", None)),
    ],
)
def test_undatable_value_with_a_ttl_is_held_until_it_expires(
    raw: redis.Redis, backend: RedisBackend, key: str, kind: str, holder: tuple[str, int | None]
) -> None:
    stored = storage_key(key)
    _write_foreign(raw, stored, kind, px=1500)
    original = _dump(raw, stored)
    start_ms = _server_ms(raw)

    assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
    held = backend.peek(key)
    assert held is not None
    assert (held.holder.host, held.holder.pid) == holder
    assert start_ms <= (held.acquired_at - EPOCH) / timedelta(milliseconds=1) <= _server_ms(raw)
    assert 0 < held.seconds_left <= 1.5
    assert [h.key for h in backend.list() if h.key == key] == [key]
    # Nobody can refresh or release it, not even with the value as the token.
    assert not backend.refresh(key, kind, ttl=LONG, max_lifetime=LIFE)
    assert not backend.release(key, kind)
    backend.clear_stale()
    assert _dump(raw, stored) == original
    assert 0 < raw.pttl(stored) <= 1500

    wait_until(lambda: raw.exists(stored) == 0, timeout=5)
    assert backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)


def test_key_without_a_ttl_is_free_and_swept(
    raw: redis.Redis, backend: RedisBackend, key: str
) -> None:
    garbage, persisted, taken = (storage_key(f"{key}-{n}") for n in ("garbage", "ours", "taken"))
    raw.set(garbage, "garbage")
    raw.set(persisted, f"{new_token()}@{_server_ms(raw)}")  # our format, TTL removed
    _write_foreign(raw, taken, "list", px=None)

    for stored in (garbage, persisted, taken):
        assert backend.peek(stored[len(KEY_PREFIX) :]) is None
    assert [h for h in backend.list() if h.key.startswith(key)] == []
    # "At least": another test run sharing this database may have abandoned keys of its own.
    assert backend.clear_stale(dry_run=True) >= 3
    assert raw.exists(garbage, persisted, taken) == 3

    token = new_token()
    assert backend.acquire(f"{key}-taken", token, ttl=LONG, max_lifetime=LIFE)
    value = raw.get(taken)
    assert isinstance(value, bytes)
    assert value.startswith(token.encode() + b"@")
    assert 0 < raw.pttl(taken) <= 30_000
    assert backend.clear_stale() >= 2
    assert raw.exists(garbage, persisted) == 0
    assert raw.exists(taken) == 1


# -- connections -------------------------------------------------------------------


def test_heartbeat_survives_a_killed_connection(raw: redis.Redis, key: str) -> None:
    # The ttl leaves a busy machine 1.7 s to reconnect and refresh, every 0.3 s.
    ttl = 2
    name = f"tasklock-test-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(_url(), client_name=name)
    backend = RedisBackend(client=client)
    rival = RedisBackend(url=_url())
    killed: list[int] = []
    rivals: list[bool] = []

    def ours() -> list[int]:
        return [int(c["id"]) for c in raw.client_list() if c.get("name") == name]

    def work() -> None:
        time.sleep(0.5)  # the heartbeat has likely refreshed on its connection (else the
        # acquisition's is killed: the refresh that follows must reconnect just the same)
        for client_id in ours():
            if raw.client_kill_filter(_id=str(client_id)):
                killed.append(client_id)
        end = time.monotonic() + 2 * ttl  # twice the ttl: only refreshes keep it held
        while time.monotonic() < end:
            rivals.append(rival.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE))
            time.sleep(0.1)

    try:
        result = TaskLockService(backend).run_exclusive(key, work, ttl=ttl, refresh_interval=0.3)
        assert killed
        assert result.acquired
        assert not result.lost
        assert rivals
        assert not any(rivals)
        assert raw.exists(storage_key(key)) == 0
        assert set(ours()).isdisjoint(killed)  # it reconnected
    finally:
        client.close()


def test_location_names_the_server_and_db_never_the_password() -> None:
    # No server call: the pool's options say it (a password the server would refuse).
    backend = RedisBackend(url="redis://:s3cret@127.0.0.1:6399/7")
    try:
        assert backend.location() == "127.0.0.1:6399, db 7"
        assert "s3cret" not in backend.location()
    finally:
        backend.close()


def test_location_of_a_cluster_names_its_masters(redis_cluster: Any) -> None:
    backend = RedisBackend(url=redis_cluster.url)
    try:
        assert backend.location().startswith("Redis Cluster (127.0.0.1:")
    finally:
        backend.close()


@contextmanager
def _pipelined(backend: RedisBackend) -> Iterator[list[tuple[str, list[str]]]]:
    """Each script call ``backend`` pipelines meanwhile, as (script name, its keys)."""
    scripts = backend._calls()
    sent: list[tuple[str, list[str]]] = []
    run_many = scripts.run_many

    def recording(calls: Any, *args: Any, **kwargs: Any) -> Any:
        sent.extend((name, [text(k) for k in keys]) for name, keys, _ in calls)
        return run_many(calls, *args, **kwargs)

    scripts.run_many = recording  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        del scripts.run_many


def test_a_reap_sends_no_script_for_the_callers_own_leases(
    backend: RedisBackend, key: str
) -> None:
    """The heartbeat names its process's leases (``alive``): their holder is alive, so
    the reap looks only at the others (a dead holder's here, reaped)."""
    from django_tasklock.testing.cases_dead import dead_token, proofs_here

    proofs_here()
    ours = [f"{key}-ours-{n}" for n in range(3)]
    for name in ours:
        assert backend.acquire(name, new_token(), ttl=LONG, max_lifetime=LIFE)
    dead = f"{key}-dead"
    assert backend.acquire(dead, dead_token(), ttl=LONG, max_lifetime=LIFE)
    mine = {storage_key(name) for name in [*ours, dead]}
    with _pipelined(backend) as sent:
        assert [held.key for held in backend.reap_dead_holders(set(ours))] == [dead]
    assert mine & {k for _, keys in sent for k in keys} == {storage_key(dead)}
    with _pipelined(backend) as sent:
        backend.reap_dead_holders()  # without them: each of ours is looked at
    assert mine & {k for _, keys in sent for k in keys} == {storage_key(n) for n in ours}
    for name in ours:
        assert backend.peek(name) is not None


def test_a_reap_looks_at_500_keys_per_script(raw: redis.Redis, key: str) -> None:
    """One ``of_machine`` script per 500 keys of the namespace on one Redis (one per key
    before): 1,200 leases held here cost 3 scripts, not 1,200."""
    from django_tasklock.testing.cases_dead import proofs_here

    machine = proofs_here()
    backend = RedisBackend(url=_url())
    names = [f"{key}-{n}" for n in range(1200)]
    pipe = raw.pipeline(transaction=False)
    for name in names:  # leases of a live process of this machine: ours
        pipe.set(storage_key(name), new_token(), px=60_000)
    pipe.execute()
    with _pipelined(backend) as sent:
        assert backend.reap_dead_holders() == []
    sizes = [len(keys) for name, keys in sent if name == "of_machine"]
    assert f"/{machine}." in new_token()
    assert sum(sizes) >= len(names)  # every key (and any other test's)
    assert len(sizes) == -(-sum(sizes) // 500)
    assert max(sizes) <= 500
