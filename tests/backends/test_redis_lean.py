"""The Redis backend's lean script calls (backends/redis/lean.py): the same outcomes as
``client.evalsha``, the client's own retries, and standing aside where it could not
speak for the client (an instrumentation, a single connection, a callback, an encoding)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings

from django_tasklock import TaskLockService
from django_tasklock.backends.base import Refresh, lease_id
from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.lean import Lean
from django_tasklock.leases.tokens import new_token
from django_tasklock.testing.proxy import FaultProxy
from django_tasklock.testing.support import LIFE, LONG
from tests.conftest import require_service
from tests.support.otel_support import Telemetry, children, observed
from tests.support.servers import private_redis

pytestmark = pytest.mark.databases


@pytest.fixture
def url() -> str:
    require_service("redis")
    assert settings.REDIS_URL is not None
    return settings.REDIS_URL


@pytest.fixture
def flushable_url() -> Iterator[str]:
    """A private server's URL, for the cases that ``SCRIPT FLUSH``: that empties
    every database's scripts, and other test workers share the test Redis."""
    require_service("redis")
    with private_redis() as server:
        yield server.url


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    yield from observed()


def _no_evalsha(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("client.evalsha used: the lean call stood aside")


def test_a_url_client_sends_its_scripts_lean_with_the_same_outcomes(
    flushable_url: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RedisBackend(url=flushable_url)
    try:
        scripts = backend._calls()
        assert scripts.lean is not None
        assert scripts.lean.usable()
        monkeypatch.setattr(scripts.client, "evalsha", _no_evalsha)
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert not backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)  # sent again: ours
        assert backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
        other = new_token()
        assert backend.refresh_many(
            [Refresh(key, token, LONG, LIFE), Refresh(key, other, LONG, LIFE)]
        ) == [True, False]
        scripts.client.script_flush()  # NOSCRIPT: loaded again, sent again
        assert backend.refresh(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.fence(key, token) is not None
        held = backend.peek(key)
        assert held is not None
        assert held.key == key
        assert backend.release(key, token)
        assert backend.peek(key) is None
        result = TaskLockService(backend).run_exclusive(key, lambda: "ran", ttl=5)
        assert (result.acquired, result.result, result.lost) == (True, "ran", False)
    finally:
        backend.close()


@pytest.fixture
def proxy(url: str) -> Iterator[FaultProxy]:
    import redis

    pool = redis.Redis.from_url(url).connection_pool
    host, port = pool.connection_kwargs["host"], pool.connection_kwargs["port"]
    with FaultProxy((host, port), lifetime=60) as running:
        yield running


def _through(proxy: FaultProxy, url: str, **options: Any) -> Any:
    import redis

    db = redis.Redis.from_url(url).connection_pool.connection_kwargs.get("db", 0)
    return redis.Redis(host=proxy.host, port=proxy.port, db=db, **options)


def test_a_client_that_retries_still_retries_a_lost_reply(
    proxy: FaultProxy, url: str, key: str
) -> None:
    # redis.Redis(...) built by hand retries a command whose connection broke; sent
    # again, the acquisition finds its own token: acquired, once.
    client = _through(proxy, url)
    backend = RedisBackend(client=client)
    try:
        assert backend._calls().lean is not None
        assert client.connection_pool.get_connection().retry.get_retries() > 0
        token = new_token()
        proxy.drop_reply(match=b"EVALSHA", times=1)
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert proxy.dropped == 1
        held = backend.peek(key)
        assert held is not None
        assert held.lease == lease_id(token)
        assert backend.release(key, token)
    finally:
        backend.close()


def test_a_client_without_retries_raises_the_lost_reply(
    proxy: FaultProxy, url: str, key: str
) -> None:
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError
    from redis.retry import Retry

    client = _through(proxy, url, retry=Retry(NoBackoff(), 0))
    backend = RedisBackend(client=client)
    try:
        assert backend._calls().lean is not None
        token = new_token()
        proxy.drop_reply(match=b"EVALSHA", times=1)
        with pytest.raises(ConnectionError):
            backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.peek(key) is not None  # the server acted; the caller was told
        assert backend.release(key, token)
    finally:
        backend.close()


def _below(telemetry: Telemetry, name: str) -> list[Any]:
    """The spans whose parent is the ``tasklock.acquire`` span named ``name``."""
    [span] = [
        span
        for span in telemetry.finished("tasklock.acquire")
        if (span.attributes or {}).get("tasklock.name") == name
    ]
    return list(children(telemetry, span))


def test_an_instrumentation_added_later_sees_every_call(
    url: str, key: str, telemetry: Telemetry
) -> None:
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    backend = RedisBackend(url=url)
    service = TaskLockService(backend)
    try:
        with service.lock(key, name="before"):
            pass
        lean = backend._calls().lean
        assert lean is not None
        assert lean.usable()
        instrumentor = RedisInstrumentor()
        instrumentor.instrument(tracer_provider=telemetry.tracer_provider, skip_dep_check=True)
        try:
            assert not lean.usable()
            with service.lock(key, name="instrumented"):
                pass
        finally:
            instrumentor.uninstrument()
        assert lean.usable()
        below = _below(telemetry, "instrumented")
        assert below
        assert all((s.attributes or {}).get("db.system") == "redis" for s in below)
        assert _below(telemetry, "before") == []
    finally:
        backend.close()


@pytest.mark.parametrize(
    "options",
    [
        {"single_connection_client": True},
        {"encoding": "latin-1"},
    ],
    ids=["single connection", "latin-1"],
)
def test_clients_it_cannot_speak_for_use_evalsha(
    url: str, key: str, options: dict[str, Any]
) -> None:
    import redis

    client = redis.Redis.from_url(url, **options)
    assert Lean.of(client) is None
    backend = RedisBackend(client=client)
    try:
        assert backend._calls().lean is None
        token = new_token()
        assert backend.acquire(key, token, ttl=timedelta(seconds=5), max_lifetime=LIFE)
        assert backend.release(key, token)
    finally:
        backend.close()


def test_a_response_callback_for_evalsha_is_left_to_the_client(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.set_response_callback("EVALSHA", lambda reply, **options: reply)
    lean = Lean.of(client)
    assert lean is not None
    assert not lean.usable()  # looked at on every call: one registered later counts too


def test_only_a_redis_client_is_sent_lean() -> None:
    assert Lean.of(object()) is None  # a RedisCluster is no redis.Redis either


def test_a_client_instrumented_on_its_own_later_sees_every_call(
    url: str, key: str, telemetry: Telemetry
) -> None:
    # RedisInstrumentor.instrument_client() wraps execute_command on the client
    # object, not its class: before, the lean call went on past it, and the
    # lock's storage calls made no span.
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    backend = RedisBackend(url=url)
    service = TaskLockService(backend)
    try:
        with service.lock(key, name="before"):
            pass
        client = backend._conn()
        lean = backend._calls().lean
        assert lean is not None
        RedisInstrumentor.instrument_client(client, tracer_provider=telemetry.tracer_provider)
        try:
            assert not lean.usable()
            with service.lock(key, name="instrumented"):
                pass
        finally:
            RedisInstrumentor.uninstrument_client(client)
        below = _below(telemetry, "instrumented")
        assert below
        assert all((s.attributes or {}).get("db.system") == "redis" for s in below)
    finally:
        backend.close()


def test_a_response_callback_registered_later_is_honoured(url: str, key: str) -> None:
    backend = RedisBackend(url=url)
    seen: list[Any] = []

    def callback(reply: Any, **options: Any) -> Any:
        seen.append(reply)
        return reply

    try:
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        backend._conn().set_response_callback("EVALSHA", callback)
        assert backend.release(key, token)
        assert seen == [1]  # the release's reply went through the client's callback
    finally:
        backend.close()


def test_clients_that_override_a_skipped_step_use_evalsha(url: str) -> None:
    import redis
    from redis.connection import Connection

    class Parsing(redis.Redis):
        def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
            return super().parse_response(connection, command_name, **options)  # type: ignore[no-untyped-call]

    class Packing(Connection):
        def pack_command(self, *args: Any) -> Any:
            return super().pack_command(*args)  # type: ignore[no-untyped-call]

    def patched(self: Any, *args: Any, **options: Any) -> Any:  # no functools.wraps
        return original(self, *args, **options)  # type: ignore[no-untyped-call]

    assert Lean.of(Parsing.from_url(url)) is None
    assert Lean.of(redis.Redis.from_url(url, connection_class=Packing)) is None
    original = redis.Redis.execute_command
    redis.Redis.execute_command = patched  # type: ignore[method-assign]
    try:
        assert Lean.of(redis.Redis.from_url(url)) is None
    finally:
        redis.Redis.execute_command = original  # type: ignore[method-assign]
    assert Lean.of(redis.Redis.from_url(url)) is not None


def test_an_interrupted_call_never_goes_back_to_the_pool_with_its_reply_unread(
    url: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A KeyboardInterrupt once the command is sent cannot be caused on cue: the
    # connection's read raising it stands in for it.
    backend = RedisBackend(url=url)
    try:
        lean = backend._calls().lean
        assert lean is not None
        # The eviction-policy check's CONFIG GET takes a connection of the pool on a
        # thread of its own: once it is back, the one released here is the next given.
        assert backend.policy_check is not None
        backend.policy_check.join(60)
        pool = lean.client.connection_pool
        conn = pool.get_connection()
        pool.release(conn)

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            raise KeyboardInterrupt

        monkeypatch.setattr(conn, "read_response", interrupted)
        with pytest.raises(KeyboardInterrupt):
            backend.acquire(key, new_token(), ttl=LONG, max_lifetime=LIFE)
        monkeypatch.undo()
        assert conn._sock is None  # disconnected: the next use connects afresh
        assert backend.peek(key) is not None  # the server acted; the lease expires by itself
        backend.force_release(key)
    finally:
        backend.close()


def test_the_heartbeats_batch_is_packed_once_and_sent_lean(
    flushable_url: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same tuple of leases, tick after tick, is packed once; a new tuple anew."""
    backend = RedisBackend(url=flushable_url)
    try:
        scripts = backend._calls()
        monkeypatch.setattr(scripts.client, "evalsha", _no_evalsha)
        monkeypatch.setattr(scripts.client, "pipeline", _no_evalsha)
        tokens = [new_token() for _ in range(1200)]  # three scripts of at most 500
        keys = [f"{key}-{n}" for n in range(len(tokens))]
        for k, token in zip(keys, tokens, strict=True):
            assert backend.acquire(k, token, ttl=LONG, max_lifetime=LIFE)
        items = tuple(Refresh(k, t, LONG, LIFE) for k, t in zip(keys, tokens, strict=True))
        assert backend.refresh_many(items) == [True] * len(items)
        batch = backend._batch
        assert batch is not None
        assert batch.packed is not None
        assert len(batch.packed) == 3
        packed = batch.packed
        assert backend.release(keys[7], tokens[7])
        answers = backend.refresh_many(items)  # the same tuple: the same bytes
        assert backend._batch is batch
        assert batch.packed is packed
        assert answers == [n != 7 for n in range(len(items))]
        scripts.client.script_flush()  # NOSCRIPT in the batch: loaded again, sent again
        assert backend.refresh_many(items) == answers
        shorter = items[:10]
        assert backend.refresh_many(shorter) == [n != 7 for n in range(10)]
        assert backend._batch is not batch  # another tuple: built anew
    finally:
        for k, token in zip(keys, tokens, strict=True):
            backend.release(k, token)
        backend.close()


def test_a_batch_reply_that_is_an_error_is_raised(key: str) -> None:
    """An error reply but NOSCRIPT (BUSY: another client's script runs past
    busy-reply-threshold) fails the call, as a pipeline raising it would: the
    heartbeat then counts the leases not refreshed this time."""
    import threading

    import redis

    from tests.support.servers import private_redis

    spin = "local s = redis.call('TIME')[1] while redis.call('TIME')[1] - s < 20 do end"
    with private_redis("--busy-reply-threshold", "10") as server:
        backend = RedisBackend(url=server.url)
        other = redis.Redis.from_url(server.url)
        admin = redis.Redis.from_url(server.url)
        token = new_token()
        busy = threading.Thread(target=lambda: _ignore(other.eval, spin, 0), daemon=True)
        try:
            assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
            busy.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until the server says it is busy
                try:
                    admin.ping()
                except redis.exceptions.BusyLoadingError:
                    break
                except redis.ResponseError as error:
                    if "BUSY" in str(error):
                        break
                time.sleep(0.01)
            with pytest.raises(redis.ResponseError, match="BUSY"):
                backend.refresh_many((Refresh(key, token, LONG, LIFE),))
        finally:
            _ignore(admin.script_kill)
            if busy.is_alive():
                busy.join(30)
            backend.close()
            other.close()
            admin.close()


def _ignore(call: Any, *args: Any) -> None:
    import contextlib

    import redis

    with contextlib.suppress(redis.RedisError):
        call(*args)
