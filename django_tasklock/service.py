"""The lock service: acquire, keep alive while the work runs, release."""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
from collections.abc import Callable
from typing import Generic, TypeVar

from django_tasklock import checks as _checks  # noqa: F401 - checks also without the app
from django_tasklock.backends import get_backend
from django_tasklock.backends.base import BaseBackend, HeldLock, Holder
from django_tasklock.heartbeat import Lease, clock, heartbeat
from django_tasklock.options import (
    Duration,
    LockOptions,
    validate_callable,
    validate_key,
    validate_sync_callable,
)
from django_tasklock.signals import lock_acquired, lock_released
from django_tasklock.transactions import release_after_transactions

logger = logging.getLogger("django_tasklock")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class LockResult(Generic[T]):
    """What :meth:`TaskLockService.run_exclusive` did.

    ``acquired``: this caller held the lock and ``fn`` ran (False: ``fn`` never ran).
    ``result``: ``fn``'s return value when acquired, else None.
    ``lost``: the lease was lost (expired, taken over, force-released) while ``fn`` ran.
    """

    acquired: bool
    result: T | None = None
    lost: bool = False


def new_token() -> str:
    """An unguessable token that also names this host and process: ``host:pid:secret``."""
    return (_token_prefix or _name_this_process()) + secrets.token_urlsafe(18)


_token_prefix = ""  # "host:pid:", made on first use and again in a forked child


def _name_this_process() -> str:
    global _token_prefix
    _token_prefix = f"{socket.gethostname()}:{os.getpid()}:"
    return _token_prefix


def _forget_process_name() -> None:
    global _token_prefix
    _token_prefix = ""


os.register_at_fork(after_in_child=_forget_process_name)


class TaskLockService:
    """Runs work under a lease lock held in the configured storage.

    With no ``backend`` the one named by ``TASKLOCK_BACKEND`` is used, looked
    up at each call, so changing settings (``override_settings``) takes
    effect. A service is safe to share between threads.
    """

    def __init__(self, backend: BaseBackend | None = None) -> None:
        self._backend = backend

    @property
    def backend(self) -> BaseBackend:
        return self._backend if self._backend is not None else get_backend()

    def peek(self, key: str) -> HeldLock | None:
        """Who holds ``key`` and until when (by the storage's clock), or None if nobody."""
        return self.backend.peek(validate_key(key))

    def run_exclusive(
        self,
        key: str,
        fn: Callable[[], T],
        *,
        ttl: Duration | None = None,
        refresh_interval: Duration | None = None,
        max_lifetime: Duration | None = None,
        on_locked: Callable[[], object] | None = None,
    ) -> LockResult[T]:
        """Run ``fn()`` if, and only if, nobody else holds ``key``.

        Args:
            key: the caller's key (1 to 245 characters), stored as ``"task-lock:" + key``.
            fn: a zero-argument callable; its return value becomes ``result``.
            ttl: seconds or timedelta the lease lasts unless refreshed (default 15 min).
            refresh_interval: how often the heartbeat extends the lease while ``fn``
                runs (default ``ttl / 3``; must be less than ``ttl``).
            max_lifetime: after this long (default and most 24 h) the lease is no
                longer extended, so a runaway ``fn`` cannot hold the key forever.
            on_locked: zero-argument callable called when the key is held elsewhere.

        The lease is released whether ``fn`` returns or raises (any
        ``BaseException``, which then propagates unchanged). If the storage
        cannot be reached while acquiring, its error is raised: it is never
        reported as ``acquired=False``. A failed release is logged and leaves
        the lease to expire; it never replaces ``fn``'s outcome. When ``fn`` ran
        inside the caller's ``transaction.atomic()``, the lease is released when
        that transaction commits or rolls back, so the next holder sees its work.

        Raises:
            TypeError, ValueError: bad arguments, naming the parameter; nothing is written
                (a coroutine function for ``fn`` or ``on_locked`` names ``arun_exclusive``).
            ImproperlyConfigured: ``TASKLOCK_DEFAULTS`` is invalid.
        """
        validate_sync_callable("fn", fn, twin="arun_exclusive")
        validate_sync_callable("on_locked", on_locked, twin="arun_exclusive", optional=True)
        backend, options = self._prepare(key, fn, ttl, refresh_interval, max_lifetime, on_locked)
        # The token first and the acquisition inside the try: interrupted
        # (KeyboardInterrupt) before we know whether the lease was granted, we
        # release by the token, which deletes nothing if it was not.
        token = new_token()
        lease: Lease | None = None
        result: T | None = None
        known = False
        try:
            lease = self._acquire(backend, key, token, options)
            known = True
            if lease is not None:
                self._hold(lease)
                result = fn()
        finally:
            if lease is not None:
                self._release(lease)
            elif not known:
                _release_unknown(backend, key, token)
        if lease is None:
            if on_locked is not None:
                on_locked()
            return LockResult(acquired=False)
        return LockResult(acquired=True, result=result, lost=lease.lost)

    def _prepare(
        self,
        key: str,
        fn: object,
        ttl: Duration | None,
        refresh_interval: Duration | None,
        max_lifetime: Duration | None,
        on_locked: object,
    ) -> tuple[BaseBackend, LockOptions]:
        validate_key(key)
        validate_callable("fn", fn)
        validate_callable("on_locked", on_locked, optional=True)
        options = LockOptions.resolve(
            ttl=ttl, refresh_interval=refresh_interval, max_lifetime=max_lifetime
        )
        return self.backend, options

    @staticmethod
    def _acquire(backend: BaseBackend, key: str, token: str, options: LockOptions) -> Lease | None:
        asked_at = clock()
        if not backend.acquire(key, token, ttl=options.ttl, max_lifetime=options.max_lifetime):
            return None
        return Lease(backend, key, token, Holder.from_token(token), options, asked_at=asked_at)

    def _hold(self, lease: Lease) -> None:
        """Start keeping ``lease`` alive (call inside the ``try`` that releases it)."""
        heartbeat().add(lease)
        lease.announce(lock_acquired)

    def _release(self, lease: Lease) -> None:
        if lease.pid != os.getpid():
            return  # a forked child leaving the work: the lease is its parent's
        if release_after_transactions(lease, self._release_now):
            return  # held until the caller's transaction ends
        self._release_now(lease)

    def _release_now(self, lease: Lease) -> None:
        try:
            heartbeat().remove(lease)
        finally:  # even interrupted here, the lease is released
            self._send_release(lease)

    @staticmethod
    def _send_release(lease: Lease) -> None:
        try:
            released = lease.backend.release(lease.key, lease.token)
        except Exception:
            logger.warning(
                "Releasing task lock %r failed; the lease will expire by itself.",
                lease.key,
                exc_info=True,
            )
            if clock() > lease.valid_until:
                lease.report_lost("release, after the lease could have run out")
            return
        if released:
            lease.announce(lock_released)
        else:
            lease.report_lost("release")


def _release_unknown(backend: BaseBackend, key: str, token: str) -> None:
    """Release what an interrupted acquisition may have taken (nothing if it took nothing)."""
    try:
        backend.release(key, token)
    except Exception:
        logger.debug("Releasing %r after an interrupted acquisition failed.", key, exc_info=True)


_default_service = TaskLockService()


def run_exclusive(
    key: str,
    fn: Callable[[], T],
    *,
    ttl: Duration | None = None,
    refresh_interval: Duration | None = None,
    max_lifetime: Duration | None = None,
    on_locked: Callable[[], object] | None = None,
) -> LockResult[T]:
    """:meth:`TaskLockService.run_exclusive` on the service of ``TASKLOCK_BACKEND``."""
    return _default_service.run_exclusive(
        key,
        fn,
        ttl=ttl,
        refresh_interval=refresh_interval,
        max_lifetime=max_lifetime,
        on_locked=on_locked,
    )
