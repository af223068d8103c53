"""``TASKLOCK_REDIS_URL``: one reading for ``manage.py check`` (E009) and first use.

A URL that does not read is ``ImproperlyConfigured`` naming the setting, at
``manage.py check`` and at first use alike; every query option is honoured or
the URL is refused. Sentinel URLs against a real sentinel: ``test_sentinel.py``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_tasklock.backends.redis import RedisBackend
from django_tasklock.backends.redis.urls import RedisURL, client_from_url, parse_url
from django_tasklock.checks import check_tasklock_settings
from tests.conftest import require_service, runs_manage_py_check

BAD_URLS = [
    "127.0.0.1:6379",
    "localhost:6379",
    "http://127.0.0.1:6379/0",
    "redis://127.0.0.1:²/0",
    "redis://127.0.0.1:70000/0",
    "redis://127.0.0.1:0/0",
    "redis://127.0.0.1:6379/²",
    "redis://127.0.0.1:6379/zero",
    "redis://127.0.0.1:6379/0/1",
    "redis://:6379/0",
    "redis://a:1,b:2/0",
    "redis://127.0.0.1:6379/0?db=1",
    "redis://127.0.0.1:6379/0?nosuch=1",
    "redis://127.0.0.1:6379/0?retry_on_timeout=true",
    "redis://127.0.0.1:6379/0?socket_timeout=soon",
    "redis://127.0.0.1:6379/0?socket_timeout=-1",
    "redis://127.0.0.1:6379/0?socket_timeout=1&socket_timeout=2",
    "redis://127.0.0.1:6379/0?ssl=maybe",
    "rediss://127.0.0.1:6379/0?ssl=false",
    "unix://",
    "unix://host/tmp/redis.sock",
    "unix:///tmp/redis.sock?ssl=true",
    "redis+sentinel:///mymaster",
    "redis+sentinel://127.0.0.1:26379/",
    "redis+sentinel://127.0.0.1/mymaster",
    "redis+sentinel://127.0.0.1:²/mymaster",
    "redis+sentinel://127.0.0.1:26379/mymaster/²",
    "redis+sentinel://127.0.0.1:26379/mymaster/zero",
    "redis+sentinel://127.0.0.1:99999/mymaster",
    "redis+sentinel://127.0.0.1:26379,127.0.0.1:١٢/mymaster",
    "redis+sentinel://127.0.0.1:26379/mymaster/0?nosuch=1",
    "redis+sentinel://127.0.0.1:26379/mymaster/0?socket_timeout=x",
    "redis+cluster://",
    "redis+cluster://127.0.0.1",
    "redis+cluster://127.0.0.1:7000,127.0.0.1",
    "redis+cluster://127.0.0.1:7000/0",
    "redis+cluster://127.0.0.1:7000?db=1",
    "redis+cluster://127.0.0.1:70000",
    "redis+cluster://127.0.0.1:7000?nosuch=1",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_bad_url_is_improperly_configured_naming_the_setting_and_the_forms(url: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"^TASKLOCK_REDIS_URL: ") as info:
        parse_url(url)
    assert "redis+sentinel://" in str(info.value)


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_bad_url_is_e009_with_a_hint_naming_the_schemes(url: str) -> None:
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL=url):
        messages = check_tasklock_settings()
    assert [message.id for message in messages] == ["django_tasklock.E009"]
    assert messages[0].msg.startswith("TASKLOCK_REDIS_URL: ")
    for scheme in ("redis://", "rediss://", "unix://", "redis+sentinel://", "redis+cluster://"):
        assert scheme in str(messages[0].hint)


@pytest.mark.parametrize("url", ["127.0.0.1:6379", "redis://127.0.0.1:²/0", "redis://h/0?x=1"])
def test_a_bad_url_is_refused_at_first_use_naming_the_setting(url: str) -> None:
    from django_tasklock import run_exclusive

    ran: list[int] = []
    with (
        override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL=url),
        pytest.raises(ImproperlyConfigured, match=r"^TASKLOCK_REDIS_URL: "),
    ):
        run_exclusive("key", lambda: ran.append(1))
    assert ran == []


def test_a_bad_url_given_to_the_backend_is_a_value_error_naming_url() -> None:
    with pytest.raises(ValueError, match=r"^url: the port '²'"):
        RedisBackend(url="redis://127.0.0.1:²/0")


@runs_manage_py_check
def test_a_bad_url_fails_manage_py_check() -> None:
    with (
        override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL="http://127.0.0.1/"),
        pytest.raises(SystemCheckError) as info,
    ):
        call_command("check")
    assert "django_tasklock.E009" in str(info.value)
    assert "HINT" in str(info.value)


def test_the_message_never_shows_the_password() -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        parse_url("redis://user:s3cret@127.0.0.1:²/0")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1", RedisURL("redis", (("127.0.0.1", 6379),))),
        (
            "redis://user:p%40ss@example.com:6380/3",
            RedisURL("redis", (("example.com", 6380),), db=3, username="user", password="p@ss"),
        ),
        (
            "redis://:pw@[::1]:6379/?db=2&socket_timeout=1.5",
            RedisURL(
                "redis", (("::1", 6379),), db=2, password="pw", options={"socket_timeout": 1.5}
            ),
        ),
        (
            "rediss://h:6379/0?ssl_cert_reqs=none",
            RedisURL("rediss", (("h", 6379),), options={"ssl_cert_reqs": "none"}),
        ),
        ("unix:///run/redis.sock?db=4", RedisURL("unix", socket_path="/run/redis.sock", db=4)),
        (
            "redis+sentinel://u:p@s1:26379,[::1]:26380/my%20master/5?ssl=true",
            RedisURL(
                "redis+sentinel",
                (("s1", 26379), ("::1", 26380)),
                service="my master",
                db=5,
                username="u",
                password="p",
                options={"ssl": True},
            ),
        ),
        (
            "redis+cluster://u:p@n1:7000,[::1]:7001?socket_timeout=2",
            RedisURL(
                "redis+cluster",
                (("n1", 7000), ("::1", 7001)),
                username="u",
                password="p",
                options={"socket_timeout": 2.0},
            ),
        ),
    ],
)
def test_good_urls_read_as_written(url: str, expected: RedisURL) -> None:
    assert parse_url(url) == expected


def _kwargs(client: Any) -> dict[str, Any]:
    return dict(client.connection_pool.connection_kwargs)


def test_query_options_reach_the_client() -> None:
    client: Any = client_from_url("redis://u:p@127.0.0.1:1/3?socket_timeout=1&client_name=tl")
    kwargs = _kwargs(client)
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (1.0, 10)
    assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (3, "u", "p")
    assert kwargs["client_name"] == "tl"
    tls: Any = client_from_url("rediss://127.0.0.1:1/0")
    assert tls.connection_pool.connection_class.__name__ == "SSLConnection"


def test_a_plain_url_with_options_works_against_redis() -> None:
    require_service("redis")
    from django.conf import settings

    url = str(settings.REDIS_URL)
    client = client_from_url(url + "?client_name=tasklock-url-test&socket_timeout=2")
    assert client.client_getname() == "tasklock-url-test"


def _retries(client: Any) -> int:
    retry = client.get_retry()
    return 0 if retry is None else int(retry.get_retries())


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/0",
        "rediss://127.0.0.1:1/0",
        "unix:///tmp/nosuch.sock",
        "redis+sentinel://127.0.0.1:1/mymaster/0",
    ],
)
def test_clients_made_from_a_url_do_not_retry(url: str) -> None:
    """As ``redis.Redis.from_url`` made them: a call lasts one socket timeout at most."""
    client: Any = client_from_url(url)
    assert _retries(client) == 0
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in manager.sentinels if manager is not None else ():
        assert _retries(sentinel) == 0, "a sentinel client retries"


def test_a_url_client_facing_a_black_hole_fails_after_one_socket_timeout() -> None:
    """A server that accepts and never answers: one connection, one timeout, no retry."""
    import redis

    accepted: list[socket.socket] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(50)
        port = server.getsockname()[1]

        def accept() -> None:
            with contextlib.suppress(OSError):  # the listening socket closed
                while True:
                    accepted.append(server.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
        client = client_from_url(f"redis://127.0.0.1:{port}/0?socket_timeout=0.3")
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.get("tasklock-black-hole")
        elapsed = time.monotonic() - started
        time.sleep(0.2)  # any connection a retry opened is accepted by now
    for connection in accepted:
        connection.close()
    assert len(accepted) == 1, f"{len(accepted)} connections for one command: it retried"
    assert elapsed < 3.0, f"one command took {elapsed:.1f} s with a 0.3 s socket timeout"
