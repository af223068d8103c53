"""A child forked while another thread holds a backend's lock can still use the backend."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings

from django_tasklock.api.service import new_token
from django_tasklock.backends.memory import MemoryBackend
from tests.conftest import require_service

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)


def _child_finishes(held_lock: AbstractContextManager[Any], use: Callable[[], object]) -> bool:
    """Fork while another thread holds ``held_lock``; whether the child's ``use()`` ends well."""
    holding, may_go = threading.Event(), threading.Event()

    def holder() -> None:
        with held_lock:
            holding.set()
            may_go.wait(20)

    thread = threading.Thread(target=holder)
    thread.start()
    holding.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: never back into pytest
            code = 1
            try:
                use()
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 10
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status) == 0
            if time.monotonic() > deadline:  # deadlocked
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return False
            time.sleep(0.05)
    finally:
        may_go.set()
        thread.join()


def test_memory_backend_in_a_child_forked_while_its_lock_is_held(key: str) -> None:
    backend = MemoryBackend()

    def use() -> None:
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(key, token)

    assert _child_finishes(backend._lock, use)


def test_redis_backend_in_a_child_forked_while_its_first_connection_is_being_made(
    key: str,
) -> None:
    require_service("redis")
    from django_tasklock.backends.redis import RedisBackend

    backend = RedisBackend(url=settings.REDIS_URL)

    def use() -> None:
        token = new_token()
        assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
        assert backend.release(key, token)

    assert _child_finishes(backend._init_lock, use)
