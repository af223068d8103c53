"""Redis may evict a live lease: any ``maxmemory-policy`` but ``noeviction`` is a warning.

Every lease has a TTL, so every ``volatile-*`` policy may evict one (``volatile-ttl``
the first of all, being the nearest to expiry), and every ``allkeys-*`` too: the key
is then free, a contender is granted it at once, and the holder is not told until
its next refresh. ``django_tasklock.W002`` says so at ``manage.py check --deploy``;
a server that refuses ``CONFIG GET``
(managed Redis) is left unreported. The policies are set on private servers
(``tests/support/servers.py``), never on the shared one; on the run's private
cluster, one master's policy is set and put back.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.core import checks
from django.core.management import call_command
from django.test import override_settings

from django_tasklock.backends import get_backend
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.checks import check_tasklock_settings
from django_tasklock.leases.lease import new_token
from tests.conftest import runs_manage_py_check
from tests.support.servers import PrivateRedis, private_redis

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)
EVICTING = [
    "volatile-ttl",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
]
W002 = "django_tasklock.W002"


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with private_redis() as running:
        yield running


def _with_policy(server: PrivateRedis, policy: str) -> redis.Redis:
    client = redis.Redis.from_url(server.url)
    client.config_set("maxmemory-policy", policy)
    return client


def _closed(backend: Any) -> None:
    """Close the connections of ``backend``'s client, if it made one."""
    if isinstance(backend, RedisBackend) and backend._client is not None:
        backend._client.close()


def _looked(backend: RedisBackend) -> None:
    """Wait for ``backend``'s first-use look at the policy (its own thread) to end."""
    assert backend.policy_check is not None
    backend.policy_check.join(timeout=60)
    assert not backend.policy_check.is_alive()


def _deploy_check(url: str) -> list[checks.CheckMessage]:
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL=url):
        try:
            return [
                message
                for message in checks.run_checks(include_deployment_checks=True, tags=["tasklock"])
                if message.id == W002
            ]
        finally:
            _closed(get_backend())


@pytest.mark.parametrize("policy", EVICTING)
def test_a_policy_that_may_evict_a_lease_is_w002_at_the_deploy_check(
    server: PrivateRedis, policy: str
) -> None:
    _with_policy(server, policy)
    [warning] = _deploy_check(server.url)
    assert isinstance(warning, checks.Warning)
    assert f"maxmemory-policy {policy!r}" in warning.msg
    assert f"127.0.0.1:{server.port}" in warning.msg
    hint = str(warning.hint)
    assert "maxmemory-policy noeviction" in hint
    assert "second holder" in hint  # why: a lease evicted is a holder the first is not told of


def test_noeviction_is_clean(server: PrivateRedis, caplog: pytest.LogCaptureFixture) -> None:
    _with_policy(server, "noeviction")
    assert _deploy_check(server.url) == []


@runs_manage_py_check
def test_manage_py_check_deploy_reports_it_and_a_plain_check_does_not_connect(
    server: PrivateRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_policy(server, "volatile-lru")
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL=server.url):
        assert check_tasklock_settings() == []  # settings only: nothing is read there
        call_command("check")
        assert W002 not in capsys.readouterr().err
        call_command("check", "--deploy")  # a warning: the command passes
    err = capsys.readouterr().err
    assert W002 in err
    assert "HINT" in err


@pytest.mark.parametrize("refusal", ["disabled", "acl"])
def test_a_server_that_refuses_config_get_is_not_reported(
    refusal: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A managed Redis disables CONFIG, or its ACL refuses it: the policy cannot be
    # read, so nothing is said (the docs say to check it by hand there).
    disabled = ("--rename-command", "CONFIG", "") if refusal == "disabled" else ()
    with private_redis("--maxmemory-policy", "volatile-ttl", *disabled) as running:
        url = running.url
        if refusal == "acl":
            admin = redis.Redis.from_url(url)
            admin.acl_setuser(
                "locks", enabled=True, nopass=True, keys="*", commands=["+@all", "-config"]
            )
            url = f"redis://locks@127.0.0.1:{running.port}/0"
        with pytest.raises(redis.ResponseError):
            redis.Redis.from_url(url).config_get("maxmemory-policy")
        assert _deploy_check(url) == []


def test_an_unreachable_server_is_left_to_the_other_checks() -> None:
    # Nothing listens there: the deploy check neither fails nor warns of eviction.
    from tests.support.servers import free_port

    assert _deploy_check(f"redis://127.0.0.1:{free_port()}/0") == []


def test_volatile_ttl_evicts_a_live_lease_first(server: PrivateRedis) -> None:
    # Why W002 names volatile-*: a cache beside the locks fills the memory, and
    # Redis evicts the lease, the key nearest its expiry, while its holder runs.
    client = _with_policy(server, "volatile-ttl")
    backend = RedisBackend(url=server.url)
    holder, contender = new_token(), new_token()
    assert backend.acquire("report", holder, ttl=LONG, max_lifetime=LIFE)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 2_000_000)
    # A cache: its entries live an hour, longer than the lease. Redis evicts the key of
    # the nearest expiry among a few it samples, so the lease goes once it is sampled:
    # within 53 batches of 100 in 1,500 runs, but after more than 40 in 11 of them (a
    # fixed 40 failed so). Filled until then, up to twenty times the memory allowed.
    for batch in range(400):
        pipe = client.pipeline(transaction=False)
        for index in range(100):
            pipe.set(f"cache:{batch}:{index}", b"x" * 1000, ex=3600)
        pipe.execute()
        if backend.peek("report") is None:
            break
    assert backend.peek("report") is None, "never evicted"  # evicted, though live
    assert backend.acquire("report", contender, ttl=LONG, max_lifetime=LIFE)  # a second holder


def test_every_cluster_master_is_asked(
    redis_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    port = max(redis_cluster.masters())  # one master of three: the others are fine
    node = redis_cluster.node(port)
    node.config_set("maxmemory-policy", "volatile-lfu")
    try:
        [warning] = _deploy_check(redis_cluster.url)
        assert f"maxmemory-policy 'volatile-lfu' (127.0.0.1:{port})" in warning.msg
        assert "noeviction" not in warning.msg  # the other nodes are fine: not named
    finally:
        node.config_set("maxmemory-policy", "noeviction")


def test_the_backend_logs_w002_once_at_its_first_use(
    server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker that never runs check --deploy is told too, once per process.
    _with_policy(server, "volatile-ttl")
    backends = [RedisBackend(url=server.url), RedisBackend(url=server.url)]
    try:
        with caplog.at_level("WARNING", logger="django_tasklock"):
            for backend in backends:
                token = new_token()
                assert backend.acquire("evictable", token, ttl=LONG, max_lifetime=LIFE)
                assert backend.release("evictable", token)
                _looked(backend)
        [record] = [r for r in caplog.records if W002 in r.getMessage()]
        assert record.levelname == "WARNING"
        assert f"maxmemory-policy 'volatile-ttl' (127.0.0.1:{server.port})" in record.getMessage()
        assert "maxmemory-policy noeviction" in record.getMessage()  # the hint
    finally:
        for backend in backends:
            _closed(backend)


def test_noeviction_logs_nothing_at_first_use(
    server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    _with_policy(server, "noeviction")
    backend = RedisBackend(url=server.url)
    try:
        with caplog.at_level("DEBUG", logger="django_tasklock"):
            assert backend.peek("evictable") is None
            _looked(backend)
        assert [r for r in caplog.records if r.levelname == "WARNING"] == []
    finally:
        _closed(backend)
