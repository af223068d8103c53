"""A worker whose clock is wrong, for the contract's ``server_clock`` case.

:func:`faketime_worker_clock` builds the backend from its
:class:`~django_tasklock.testing.BackendRecipe` in a child process run under
``faketime`` (libfaketime; Debian package ``faketime``), so that every clock
of that process is off (``time.time``, ``datetime.now``, the C library), while
the storage keeps its own. The test talks to the child through
:class:`SkewedWorker`, a backend that forwards each call.

Only for storage in another process (a database server, Redis): SQLite runs
inside the worker and takes the worker's clock with it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import IO, Any

import pytest

from django_tasklock.backends.base import BaseBackend, HeldLock
from django_tasklock.testing.workers import BackendRecipe

_CHILD = "from django_tasklock.testing.skew import main; main()"
# How far the child's clock may be from the asked offset (start-up time).
_TOLERANCE_S = 60


class SkewedWorker(BaseBackend):
    """A backend in a child process whose clock is skewed; every call is forwarded."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._proc, self._to, self._from = proc, proc.stdin, proc.stdout

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        pickle.dump((method, args, kwargs), self._to)
        self._to.flush()
        try:
            status, value = pickle.load(self._from)
        except EOFError:
            raise RuntimeError("the skewed worker exited; its stderr says why") from None
        if status == "error":
            raise value
        return value

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return bool(self._call("acquire", key, token, ttl=ttl, max_lifetime=max_lifetime))

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return bool(self._call("refresh", key, token, ttl=ttl, max_lifetime=max_lifetime))

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        if min_hold is None:
            return bool(self._call("release", key, token))
        return bool(self._call("release", key, token, min_hold=min_hold))

    def force_release(self, key: str, lease: str | None = None) -> HeldLock | None:
        released: HeldLock | None = self._call("force_release", key, lease)
        return released

    def peek(self, key: str) -> HeldLock | None:
        held: HeldLock | None = self._call("peek", key)
        return held

    def list(self) -> list[HeldLock]:
        held: list[HeldLock] = self._call("list")
        return held

    def clear_stale(self, *, dry_run: bool = False) -> int:
        return int(self._call("clear_stale", dry_run=dry_run))

    def stop(self) -> None:
        self._to.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a stuck child
            self._proc.kill()
            self._proc.wait()
        self._from.close()


def faketime_worker_clock(
    recipe: BackendRecipe,
) -> Callable[[timedelta], AbstractContextManager[BaseBackend]]:
    """A ``skew_worker_clock`` hook for :class:`ContractBackend`, by ``faketime``.

    Skips the test, naming the package, where ``faketime`` is not installed;
    fails it where ``faketime`` is installed but did not move the child's clock.
    """

    @contextlib.contextmanager
    def skewed(offset: timedelta) -> Iterator[BaseBackend]:
        faketime = shutil.which("faketime")
        if faketime is None:
            pytest.skip("faketime is not installed (apt-get install faketime)")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.Popen(
            [faketime, "-f", f"{offset.total_seconds():+.0f}", sys.executable, "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        worker = SkewedWorker(proc)
        try:
            child_now = worker._call("start", recipe)
            off = child_now - time.time() - offset.total_seconds()
            assert abs(off) < _TOLERANCE_S, f"faketime did not skew the worker's clock ({off} s)"
            yield worker
        finally:
            worker.stop()

    return skewed


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:  # pragma: no cover - child
    backend: BaseBackend | None = None
    while True:
        try:
            method, args, kwargs = pickle.load(requests)
        except EOFError:
            return
        try:
            if method == "start":
                backend = args[0].build()
                value: Any = time.time()
            else:
                assert backend is not None
                value = getattr(backend, method)(*args, **kwargs)
            reply: tuple[str, Any] = ("ok", value)
        except Exception as exc:
            reply = ("error", exc)
        try:
            pickle.dump(reply, replies)
        except Exception as exc:
            pickle.dump(("error", RuntimeError(repr(exc))), replies)
        replies.flush()


def main() -> None:  # pragma: no cover - the child
    """The child's entry point: serve calls from stdin until it closes."""
    # Replies go through the real stdout only; anything printed goes to stderr.
    replies = sys.stdout.buffer
    sys.stdout = sys.stderr
    _serve(sys.stdin.buffer, replies)
