"""Tokens stay secret and keys stay literal, on every backend."""

from __future__ import annotations

import base64
import logging
from datetime import timedelta

import pytest

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import BaseBackend
from django_tasklock.testing import ContractBackend, FaultyBackend
from django_tasklock.testing.support import SignalRecorder

LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)
PECULIAR = ["'; DROP TABLE cache_entries; --", "*", "?", "[a-z]", "{x}", "%", "_", "\\", "a b"]


class TokenRecorder(FaultyBackend):
    """Fails its releases (so that the failure is logged) and remembers every token."""

    def __init__(self, inner: BaseBackend) -> None:
        super().__init__(inner, refresh_failures=1, release_fails=True)
        self.tokens: list[str] = []

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        self.tokens.append(token)
        return super().acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)


def secret(token: str) -> str:
    """The random part: after the last ``:``, before the proof of the process (``/...``)."""
    return token.rpartition(":")[2].partition("/")[0]


def test_tokens_carry_at_least_128_bits_from_secrets() -> None:
    secrets_seen = {secret(new_token()) for _ in range(1000)}
    assert len(secrets_seen) == 1000
    for value in secrets_seen:
        assert len(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))) >= 16


def test_tokens_never_reach_logs_at_info_or_signals_or_listings(
    any_backend: ContractBackend, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = TokenRecorder(any_backend.backend)
    signals = SignalRecorder()
    from django_tasklock.signals import lock_acquired, lock_lost, lock_released

    for signal in (lock_acquired, lock_released, lock_lost):
        signal.connect(signals, weak=False)
    seen: list[str] = []
    usurper = new_token()

    def work() -> None:
        seen.append(repr(recorder.peek(key)) + repr(recorder.list()))
        assert any_backend.backend.force_release(key)
        assert any_backend.backend.acquire(key, usurper, ttl=LONG, max_lifetime=LIFE)

    try:
        with caplog.at_level(logging.DEBUG, logger="django_tasklock"):
            result = TaskLockService(recorder).run_exclusive(
                key, work, ttl=0.6, refresh_interval=0.2
            )
    finally:
        for signal in (lock_acquired, lock_released, lock_lost):
            signal.disconnect(signals)
        any_backend.backend.release(key, usurper)
    assert result.acquired
    assert recorder.tokens
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert loud, "nothing was logged: the scenario did not run"
    shown = "\n".join([caplog.text, *seen, repr(signals.sent), *(r.getMessage() for r in loud)])
    for token in [*recorder.tokens, usurper]:
        assert secret(token) not in shown


def test_keys_full_of_sql_and_pattern_characters_stay_literal(
    any_backend: ContractBackend, key: str
) -> None:
    backend = any_backend.backend
    keys = [key + special for special in PECULIAR]
    tokens = {k: new_token() for k in keys}
    for k in keys:
        assert backend.acquire(k, tokens[k], ttl=LONG, max_lifetime=LIFE)
    try:
        for k in keys:
            held = backend.peek(k)
            assert held is not None
            assert held.key == k
        listed = sorted(held.key for held in backend.list() if held.key.startswith(key))
        assert listed == sorted(keys)
        # A pattern releases only itself: "*" is not a wildcard, "%" and "_" are not LIKE's.
        for pattern in ("*", "%", "_", "?"):
            assert backend.force_release(key + pattern)
            remaining = {held.key for held in backend.list() if held.key.startswith(key)}
            assert key + pattern not in remaining
            assert len(remaining) == len(keys) - 1 - ("*%_?".index(pattern))
        assert not backend.force_release(key + "%")
    finally:
        for k in keys:
            backend.release(k, tokens[k])
    assert [held.key for held in backend.list() if held.key.startswith(key)] == []


def test_tokens_never_reach_the_commands_output(active_backend: ContractBackend, key: str) -> None:
    from io import StringIO

    from django.core.management import call_command

    token = new_token()
    backend = active_backend.backend
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    try:
        shown = StringIO()
        call_command("tasklock", "list", stdout=shown)
        call_command("tasklock", "list", "--json", stdout=shown)
        assert key in shown.getvalue()
        assert secret(token) not in shown.getvalue()
    finally:
        backend.release(key, token)
