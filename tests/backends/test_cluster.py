"""The Redis backend on a real Redis Cluster (3 masters, 3 replicas, ``tests/support/cluster.py``).

The contract suite runs on it in ``test_contract.py``; here: every key of one
lock in the lease's slot, refreshes batched per slot, scripts loaded again
where a master lacks them, and the operating surfaces seeing every master.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from redis.crc import key_slot as redis_key_slot

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import Refresh, storage_key
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.scripts import fence_key, tombstone_key
from django_tasklock.backends.redis.slots import key_slot, tag_for
from tests.support.cluster import PrivateCluster

LONG = timedelta(minutes=5)
LIFE = timedelta(hours=1)
BRACES = ["{", "}", "}{", "{}", "{x}", "a{b}c", "x{}y{z}", "{{a}}", "a}b{c", "é{ü}", "{" * 40]


def slot(name: str) -> int:
    """The slot by redis-py's own CRC: a second opinion on ``slots.key_slot``."""
    return int(redis_key_slot(name.encode()))


@pytest.fixture
def backend(redis_cluster: PrivateCluster) -> Iterator[RedisBackend]:
    backend = RedisBackend(url=redis_cluster.url)
    yield backend
    if backend.policy_check is not None:
        backend.policy_check.join(10)  # its CONFIG GET may still open a connection
    backend._conn().close()


@pytest.fixture
def raw(redis_cluster: PrivateCluster) -> Iterator[Any]:
    client = redis_cluster.client()
    yield client
    client.close()


def test_companion_keys_hash_to_the_lease_slot_for_any_key() -> None:
    chars = string.ascii_letters + "{}{}{}:é€ "
    rng = random.Random(19)
    keys = BRACES + ["".join(rng.choices(chars, k=rng.randint(1, 30))) for _ in range(20_000)]
    for key in keys:
        lease = storage_key(key)
        assert key_slot(lease) == slot(lease), key
        assert slot(fence_key(key)) == slot(lease), key
        assert slot(tombstone_key(key, new_token())) == slot(lease), key
        assert lease == "task-lock:" + key  # the lease key itself is never rewritten
    assert {slot(tag_for(storage_key(f"k{i}"))) for i in range(2000)} == {
        slot(storage_key(f"k{i}")) for i in range(2000)
    }


def test_the_tags_never_change_every_worker_names_a_counter_alike() -> None:
    """The slot table is part of the stored format (a fence counter's name)."""
    assert tag_for("task-lock:reports") == "{7nR}"
    assert fence_key("a{b}c") == "tasklock-fence:{b}a{b}c"
    assert (
        tombstone_key("}{", "tok")
        == "tasklock-released:{" + tag_for("task-lock:}{")[1:-1] + "}}{@tok"
    )
    assert [tag_for("{" + tag + "}") for tag in ("06S", "Qi", "6ZJ")] == ["{06S}", "{Qi}", "{6ZJ}"]


@pytest.mark.parametrize("suffix", BRACES)
def test_a_key_with_braces_acquires_fences_and_releases_on_the_cluster(
    backend: RedisBackend, raw: Any, key: str, suffix: str
) -> None:
    """Each script touches two keys: on a cluster, CROSSSLOT if they were in two slots."""
    name = key + suffix
    token = new_token()
    assert backend.acquire(name, token, ttl=LONG, max_lifetime=LIFE)
    assert raw.exists(storage_key(name)) == 1
    first = backend.fence(name, token)
    second = backend.fence(name, token)
    assert first is not None
    assert second is not None
    assert second > first
    assert backend.refresh_many([Refresh(name, token, LONG, LIFE)]) == [True]
    assert backend.release(name, token)
    assert raw.get(tombstone_key(name, token)) == token.encode()
    assert backend.release_outcome(name, token).name == "GONE"  # the re-sent release
    raw.delete(fence_key(name), tombstone_key(name, token))


def test_scripts_flushed_on_every_master_are_loaded_again(
    redis_cluster: PrivateCluster, backend: RedisBackend, key: str
) -> None:
    """As on a replica just promoted: NOSCRIPT, then SCRIPT LOAD, then the call again."""
    names = [f"{key}:{i}" for i in range(50)]
    token = new_token()
    assert all(backend.acquire(name, token, ttl=LONG, max_lifetime=LIFE) for name in names)
    for flushed in ("refresh", "list", "fence", "release"):
        for port in redis_cluster.masters():
            redis_cluster.node(port).script_flush()
        if flushed == "refresh":
            assert backend.refresh_many([Refresh(n, token, LONG, LIFE) for n in names]) == [
                True
            ] * len(names)
        elif flushed == "list":
            assert {lock.key for lock in backend.list()} >= set(names)
        elif flushed == "fence":
            assert backend.fence(names[0], token) is not None
        else:
            assert all(backend.release(name, token) for name in names)


def _one_key_per_master(raw: Any, key: str) -> list[str]:
    """Keys whose leases live on each of the three masters."""
    found: dict[str, str] = {}
    for i in range(1000):
        name = f"{key}:{i}"
        found.setdefault(raw.get_node_from_key(storage_key(name)).name, name)
        if len(found) == 3:
            return sorted(found.values())
    raise AssertionError("three masters, but keys reach fewer")


def test_list_clearstale_and_the_command_see_every_master(
    redis_cluster: PrivateCluster, backend: RedisBackend, raw: Any, key: str
) -> None:
    names = _one_key_per_master(raw, key)
    for name in names:
        assert backend.acquire(name, new_token(), ttl=LONG, max_lifetime=LIFE)
    assert {lock.key for lock in backend.list() if lock.key.startswith(key)} == set(names)
    stale = [f"{name}:stale" for name in names]
    for name in stale:
        raw.set(storage_key(name), "no ttl: left behind")
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL=redis_cluster.url):
        out = _command("list")
        assert all(name in out for name in names)
        assert backend.clear_stale(dry_run=True) >= 3  # one per master (the run's other tests
        assert raw.exists(*map(storage_key, stale)) == 3  # clean up after themselves)
        _command("clearstale")
    assert raw.exists(*(storage_key(name) for name in stale)) == 0
    assert raw.exists(*(storage_key(name) for name in names)) == 3
    raw.delete(*(storage_key(name) for name in names))


def _command(*args: str) -> str:
    import io

    out = io.StringIO()
    call_command("tasklock", *args, stdout=out, stderr=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_admin_page_lists_the_locks_of_every_master(
    redis_cluster: PrivateCluster, backend: RedisBackend, raw: Any, key: str
) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from tests.ops.test_admin import LIST_URL

    names = _one_key_per_master(raw, key)
    for name in names:
        assert backend.acquire(name, new_token(), ttl=LONG, max_lifetime=LIFE)
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL=redis_cluster.url):
        html = client.get(LIST_URL, {"q": key}).content.decode()
    assert all(f"<code>{name}</code>" in html for name in names)
    raw.delete(*(storage_key(name) for name in names))


def test_a_cluster_url_makes_a_client_that_does_not_retry_and_takes_its_options(
    redis_cluster: PrivateCluster,
) -> None:
    from django_tasklock.backends.redis.urls import client_from_url

    client: Any = client_from_url(redis_cluster.url + "?socket_timeout=2&client_name=tl-c")
    try:
        assert client.retry.get_retries() == 0
        for node in client.get_primaries():
            connection = client.get_redis_connection(node)
            assert connection.connection_pool.connection_kwargs["socket_timeout"] == 2.0
            assert connection.get_retry().get_retries() == 0
            assert connection.client_getname() == "tl-c"
    finally:
        client.close()


def test_a_pipelined_call_that_fails_otherwise_raises_and_is_not_sent_again(
    backend: RedisBackend, key: str
) -> None:
    from redis.exceptions import ResponseError

    calls = [("acquire", [storage_key(f"{key}:{i}")], ["token", "soon", 1000]) for i in range(9)]
    with pytest.raises(ResponseError, match="not an integer"):  # SET ... PX soon
        backend._calls().run_many(calls)
