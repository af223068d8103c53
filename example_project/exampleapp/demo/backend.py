"""Before the scenarios: say which backend is in use, and make sure the demo can use it."""

from __future__ import annotations

import os
import time

from django.core.management.base import CommandError

from django_tasklock import BaseBackend, TaskLockService
from exampleapp.demo.console import Console


def ready_backend(console: Console, keys: list[str]) -> BaseBackend:
    """The configured backend, reachable, shared across processes, and ``keys`` free."""
    backend = TaskLockService().backend
    cls = type(backend)
    chosen = os.environ.get("TASKLOCK_BACKEND") or "unset, so database"
    console.say(f"Lock backend: {cls.__module__}.{cls.__qualname__} (TASKLOCK_BACKEND: {chosen})")
    location = getattr(backend, "location", None)  # Redis: which server and database
    if location is not None:
        try:
            console.say(f"Redis: {location()}")
        except Exception as exc:
            raise CommandError(
                f"The lock backend cannot be reached: {type(exc).__name__}: {exc}"
            ) from exc
    if not backend.capabilities.cross_process:
        raise CommandError(
            f"{cls.__qualname__} keeps locks inside one process, and this demo runs several. "
            "Use TASKLOCK_BACKEND=database (the default) or redis."
        )
    for key in keys:
        _wait_until_free(console, backend, key)
    return backend


def _wait_until_free(console: Console, backend: BaseBackend, key: str) -> None:
    """Let a lease left by an interrupted earlier run expire (never force it)."""
    try:
        held = backend.peek(key)
    except Exception as exc:
        raise CommandError(
            f"The lock backend cannot be reached: {type(exc).__name__}: {exc}"
        ) from exc
    if held is None:
        return
    console.say(
        f"{key!r} is still held by {held.holder}, probably from an interrupted run; "
        f"waiting {held.seconds_left:.1f} s for its lease to end."
    )
    time.sleep(held.seconds_left + 0.2)
    held = backend.peek(key)
    if held is not None:
        raise CommandError(
            f"{key!r} is held by {held.holder}, a live process: is another demo running?"
        )
