"""No duplicate enqueues: at most one identical task queued or running (``unique_on=``).

This is not run-time exclusion (``@exclusive``, which lets any number of
identical tasks into the queue and skips those that start while one runs).
Here the *enqueue* is refused while an identical task is queued or running.

A claim is a lease. The caller that enqueues takes it, under a fresh token
that travels with the task (:func:`claim`). The worker that runs the task takes
the same lease over by that token (:class:`ClaimedLock`), keeps it alive with
the heartbeat while the task runs, and releases it when the task ends, whether
it returned or raised (unless it was sent again with its token, a retry: then
the lease is left to that task, :meth:`ClaimedLock.hand_on`). Nobody ever has
to clear a flag: a task whose worker died, or that never reaches a worker,
frees its key when the lease runs out,
``ttl`` after the last refresh (or after the enqueue, while it waits).

The task framework integrations (``django_tasklock.contrib.celery``,
``django_tasklock.contrib.django_tasks``) build on these three pieces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from django_tasklock.backends import get_backend
from django_tasklock.backends.base import BaseBackend, lease_id
from django_tasklock.durations import Duration
from django_tasklock.exceptions import AlreadyEnqueued
from django_tasklock.leases import observe
from django_tasklock.leases.heartbeat import heartbeat
from django_tasklock.leases.lease import Lease, clock, new_token
from django_tasklock.locking import loss
from django_tasklock.locking.lock import Lock
from django_tasklock.locking.options import LockOptions, validate_key

T = TypeVar("T")

logger = logging.getLogger("django_tasklock")

# Looks at the key (and attempts at taking it when free) before a refusal
# naming no holder: the key changed hands at each of them.
_CLAIM_ATTEMPTS = 3


def claim(key: str, *, ttl: Duration, backend: BaseBackend | None = None) -> str:
    """Take ``key`` for a task about to be enqueued; return the token to send with it.

    The lease lasts ``ttl`` unless a worker starts the task and keeps it alive.

    Raises:
        AlreadyEnqueued: an identical task (same key) is queued or running.
        TypeError, ValueError: a bad key or ttl, naming it; nothing is written.
        The storage's own error when it cannot be reached (never "already enqueued").
    """
    validate_key(key)
    options = LockOptions.resolve(ttl=ttl)
    storage = backend if backend is not None else get_backend()
    held = None
    for _ in range(_CLAIM_ATTEMPTS):
        # A read first: while the key is held (a burst of the same enqueue), no
        # failed INSERT for PostgreSQL to log.
        held = storage.peek(key)
        if held is not None:
            break
        token = new_token(claim=True)
        if storage.acquire(key, token, ttl=options.ttl, max_lifetime=options.max_lifetime):
            return token
        # Taken between our look and our take (a rival enqueue of the same
        # burst): look again, so that the refusal names who holds it, or, if
        # that task has ended already, take the key after all.
    raise AlreadyEnqueued(key, held)


def unclaim(key: str, token: str, *, backend: BaseBackend | None = None) -> None:
    """Free the key of a task that will not run (its send failed, it was revoked).

    Deletes nothing but that task's own lease; a storage error is logged, and
    the lease then runs out by itself.
    """
    storage = backend if backend is not None else get_backend()
    try:
        storage.release(key, token)
    except Exception:
        logger.warning(
            "Freeing the unique key %r failed; it is free once its ttl has passed.",
            key,
            exc_info=True,
        )


class ClaimedLock(Lock):
    """The lease a task's enqueue took, taken over by the worker that runs the task.

    Acquiring it succeeds when the lease is still the task's (or has run out
    with nobody else taking the key), and extends it to ``ttl`` from now at
    once; it fails when an identical task enqueued since holds the key.
    From then on it is a :class:`Lock` like any other: kept alive by the
    heartbeat, released when the task ends. A claim is one task's per key:
    ``limit`` is refused (``TypeError``), as ``claim()`` takes none.
    """

    def __init__(self, key: str, token: str, *, ttl: Duration, **options: object) -> None:
        if "limit" in options:
            raise TypeError("a unique task's claim takes no limit: one task per key")
        super().__init__(key, ttl=ttl, **options)  # type: ignore[arg-type]
        self._claim = token

    def _new_token(self) -> str:
        return self._claim

    def _ask(self, backend: BaseBackend, lease: Lease) -> bool:
        # A lease still live keeps the expiry the enqueue gave it: extend it now,
        # so that it lasts as long as this lock's local deadline says.
        terms = {"ttl": self.options.ttl, "max_lifetime": self.options.max_lifetime}
        if not (super()._ask(backend, lease) and backend.refresh(self.key, lease.token, **terms)):
            return False
        # The storage caps the lease at the claim's acquisition (the enqueue) +
        # max_lifetime, by its clock: the local deadline counts from there too,
        # or the task would believe it holds the key after the storage let it go.
        # Read after the takeover: the storage's "now" is later than ``asked``.
        asked = clock()
        held = backend.peek(self.key)
        if held is None or held.lease != lease_id(lease.token):
            return False  # gone, or taken, since the refresh
        storage_now = held.expires_at - timedelta(seconds=held.seconds_left)
        left = held.acquired_at + self.options.max_lifetime - storage_now
        lease.cap(asked + left.total_seconds())
        return True

    def hand_on(self) -> None:
        """Let go of the lease without ending it: the task was sent again with its token.

        The lease is extended to ``ttl`` from now and left to whichever worker
        runs the re-sent task (which takes it over by the token, as for any
        claim), so that the key stays held while that task waits. A release
        here would delete it even after that worker took it over. Raises
        ``RuntimeError`` if this lock is not held.
        """
        lease = self._lease
        if lease is None or not self._held:
            raise RuntimeError(f"task lock {self.key!r} is not held")
        self._held = False
        try:
            heartbeat().remove(lease, wait=True)  # a refresh under way lands first
            self.backend.refresh(
                self.key, lease.token, ttl=self.options.ttl, max_lifetime=self.options.max_lifetime
            )
        except Exception:
            logger.warning(
                "Extending the unique key %r for the task sent again failed; it is "
                "free once its ttl has passed.",
                self.key,
                exc_info=True,
            )
        finally:
            self._dismiss()  # the object may be acquired again
            if observe.observer is not None:
                observe.observer.released(lease)


def run_claimed(
    key: str,
    token: str,
    fn: Callable[[], T],
    *,
    ttl: Duration,
    name: str = "task",
    backend: BaseBackend | None = None,
    sent_again: tuple[type[BaseException], ...] = (),
) -> tuple[bool, T | None]:
    """Run ``fn()`` under the task's claim, then free the key: ``(ran, result)``.

    When an identical task enqueued since holds the key (this one waited in
    the queue longer than ``ttl``), ``fn`` does not run: ``(False, None)``,
    logged at INFO. Whatever ``fn`` raises propagates, after the release;
    one of ``sent_again`` (the framework's "retry" exception: the task was
    sent again with its token) hands the claim on instead of freeing it.
    """
    claim = ClaimedLock(key, token, ttl=ttl, backend=backend)
    lock: Lock = claim
    if not claim.try_acquire():
        # The claim's lease may have been ended by a release already (a retry that
        # raised nothing, a message delivered again): Redis then refuses its token,
        # so that a late copy of a request writes nothing. The key may be free all
        # the same: then this run takes it, with a token of its own, as any caller.
        lock = Lock(key, ttl=ttl, backend=backend)
        if not lock.try_acquire():
            logger.info(
                "Not running %s: its unique key %r was held by an identical task enqueued "
                "after it (it waited longer than its ttl).",
                name,
                key,
            )
            return False, None
    handed_on = False
    try:
        context = loss.enter(lock, stop=False)
        try:
            return True, fn()
        except sent_again:
            if lock is claim:  # the re-sent task carries the claim's token, not a fresh one
                handed_on = True
                claim.hand_on()
            raise
        finally:
            loss.leave(context)
    finally:
        if not handed_on:
            lock.release()
