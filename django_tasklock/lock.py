"""The lock object everything else wraps: acquire (waiting if asked), hold, release.

``run_exclusive``, ``arun_exclusive``, ``with lock``, ``async with lock`` (and
the decorator) are thin layers over :class:`Lock`. Its async methods (in
``lock_async``) run the same synchronous steps off the event loop; only the
pauses between looks at a held key are ``asyncio.sleep``.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import TYPE_CHECKING

from django_tasklock import loss, observe
from django_tasklock.aio import refuse_event_loop
from django_tasklock.backends import get_backend
from django_tasklock.backends.base import BaseBackend, HeldLock, Holder
from django_tasklock.chosen import choose, remembered
from django_tasklock.exceptions import LockNotAcquired
from django_tasklock.heartbeat import heartbeat
from django_tasklock.lease import Lease, clock
from django_tasklock.lock_async import AsyncLockMethods
from django_tasklock.options import LockOptions, check_lock_kwargs, validate_key
from django_tasklock.releasing import discard, send_release
from django_tasklock.signals import lock_acquired
from django_tasklock.tokens import new_token, this_pid, this_process
from django_tasklock.transactions import release_after_transactions
from django_tasklock.waiting import Backoff

if TYPE_CHECKING:
    from contextvars import Token

    from typing_extensions import Unpack

    from django_tasklock.aio import LossCanceller
    from django_tasklock.observe import Acquisition
    from django_tasklock.options import LockKwargs

logger = logging.getLogger("django_tasklock")


class Lock(AsyncLockMethods):
    """A lease lock on one key: ``with``, ``async with``, or ``acquire()``/``release()``.

    Made by :meth:`TaskLockService.lock` (or ``django_tasklock.lock``); every
    option is validated here, before anything is written. A Lock object
    holds the key at most once at a time and may be acquired again after it
    is released (each time with a new token).

    While held: ``holder`` is who holds it (this host and pid), ``lost``
    turns True if the lease is lost (expired, taken over, force-released,
    ``max_lifetime`` passed), and ``fence`` is the grant's fencing token when
    ``fencing=True``. Acting on a loss: ``raise_if_lost()``, ``lost_event``,
    ``wait_lost()``, ``progress()`` (see :class:`~django_tasklock.loss.ActsOnLoss`),
    and ``cancel_on_loss=True`` for ``async with``.
    """

    def __init__(
        self, key: str, *, backend: BaseBackend | None = None, **options: Unpack[LockKwargs]
    ) -> None:
        chosen = remembered(options)  # the same options as an earlier lock's: valid
        if chosen is None:
            check_lock_kwargs(options)
            self.key = validate_key(key)
            chosen = choose(options)
        else:
            self.key = validate_key(key)
        #: What telemetry calls this lock (``name=``; ``@exclusive``: its key template).
        self.name = chosen.name
        self.options: LockOptions = chosen.options
        self.wait = chosen.wait
        self.min_hold = chosen.min_hold
        self.fencing = chosen.fencing
        self.cancel_on_loss = chosen.cancel_on_loss
        self.progress_timeout = chosen.progress_timeout
        #: The grant's fencing token (``fencing=True``), strictly increasing per key.
        self.fence: int | None = None
        self._backend = backend
        self._lease: Lease | None = None
        self._held = False
        #: The holder seen by the last look at the key that found it held (see skipped).
        self.seen: HeldLock | None = None
        self._context: Token[loss.Holding | None] | None = None
        self._canceller: LossCanceller | None = None

    def __repr__(self) -> str:
        return f"<Lock {self.key!r} {'held' if self._held else 'not held'}>"

    @property
    def backend(self) -> BaseBackend:
        """The backend given, else the one ``TASKLOCK_BACKEND`` names now."""
        return self._backend if self._backend is not None else get_backend()

    @property
    def held(self) -> bool:
        """True from acquisition to release (even if the lease was lost meanwhile)."""
        return self._held

    @property
    def holder(self) -> Holder | None:
        """This host and pid once acquired (kept after release), else None."""
        return self._lease.holder if self._lease is not None else None

    @property
    def lost(self) -> bool:
        """True from the lease's local deadline on, or once a refresh or the release
        found it gone or someone else's (a release sent twice that finds its own
        lease gone, before it could have run out, is no loss); see ``Lease.lost``.
        No storage call."""
        return self._lease is not None and self._lease.lost

    # -- sync ------------------------------------------------------------------

    def acquire(self) -> Lock:
        """Take the key, waiting up to ``wait``; return this lock.

        Raises:
            LockNotAcquired: another holder kept the key all along.
            The storage's own error when it cannot be reached (never "not acquired").
        """
        if not self.try_acquire():
            raise LockNotAcquired(self.key, self.wait or None)
        return self

    def try_acquire(self) -> bool:
        """Like :meth:`acquire`, but False instead of ``LockNotAcquired``."""
        self._no_cancel_on_loss()
        refuse_event_loop(self.key, "with lock / acquire()", "async with lock / aacquire()")
        backend = self._ready()
        if observe.observer is None:
            return self._take(backend, None)
        with observe.observer.acquiring(self, backend) as seen:
            return seen.granted(self._take(backend, seen))

    def _take(self, backend: BaseBackend, seen: Acquisition | None) -> bool:
        if not self.wait:  # one try, as a Backoff of no time would allow
            self.seen = None  # see _try_once
            return self._grant(backend)
        backoff = Backoff(self.wait)
        look_first = False
        while True:
            acquired, seconds_left = self._try_once(backend, look_first)
            if acquired:
                return True
            pause = backoff.next_pause(seconds_left)
            if pause is None:
                return False
            if seen is not None and not look_first:
                seen.waiting()
            time.sleep(pause)
            look_first = True

    def release(self) -> None:
        """Let go of the key (with ``min_hold``: not before acquisition + ``min_hold``).

        Inside the caller's ``transaction.atomic()`` the lease is kept (and
        refreshed) until that transaction commits or rolls back, so the next
        holder sees the work's effects. A failed release is logged and the
        lease left to expire; finding the key someone else's, or the lease
        gone, marks it ``lost`` — unless the backend answers that the release
        was sent twice (its reply lost) and found its own lease gone, and
        it was sent before the lease could have run out. Never raises for the
        storage's sake. Raises ``RuntimeError`` if this lock is not held.
        """
        lease = self._lease
        if lease is None or not self._held:
            raise RuntimeError(f"task lock {self.key!r} is not held")
        self._held = False
        self._end(lease)

    def __enter__(self) -> Lock:
        self.acquire()
        self._context = loss.enter(self, stop=False)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        loss.leave(self._context)
        self._context = None
        self.release()

    # -- the steps -------------------------------------------------------------

    def _ready(self) -> BaseBackend:
        if self._held:
            raise RuntimeError(f"task lock {self.key!r} is already held by this Lock")
        backend = self.backend
        if self.fencing and type(backend).fence is BaseBackend.fence:
            raise NotImplementedError(
                f"fencing=True needs a backend with fencing tokens; "
                f"{type(backend).__name__} has none"
            )
        return backend

    def _try_once(self, backend: BaseBackend, look_first: bool) -> tuple[bool, float | None]:
        """One look at the key: (acquired, seconds the holder's lease has left if seen).

        A waiter reads before it writes: while the key is held, polling costs
        one read and no failed INSERT (which PostgreSQL would log as an error).
        """
        if look_first:
            held = backend.peek(self.key)
            if held is not None:
                self.seen = held
                return False, held.seconds_left
        self.seen = None  # an insert that fails says nothing of who holds the key
        return self._grant(backend), None

    def _new_token(self) -> str:
        """The token of the next grant (a subclass may hand over one issued before)."""
        return new_token()

    def _ask(self, backend: BaseBackend, token: str) -> bool:
        """Ask the storage for the lease; True when granted."""
        return backend.acquire(
            self.key, token, ttl=self.options.ttl, max_lifetime=self.options.max_lifetime
        )

    def _grant(self, backend: BaseBackend) -> bool:
        token = self._new_token()
        lease = Lease(
            backend,
            self.key,
            token,
            this_process(),
            self.options,
            asked_at=clock(),
            progress_timeout=self.progress_timeout,
        )
        # The token exists before the request goes out: interrupted before we
        # learn whether the lease was granted (KeyboardInterrupt), or failing
        # to fence it, we release by the token, which deletes nothing if the
        # lease was not granted.
        try:
            granted = self._ask(backend, token)
            fence = backend.fence(self.key, token) if granted and self.fencing else None
        except BaseException:
            discard(backend, self.key, token)
            raise
        if not granted:
            return False
        if self.fencing and fence is None:
            # Expired before it was fenced: not a grant. Clear our row if left.
            discard(backend, self.key, token)
            return False
        if not self._own(lease, fence):
            # Its async caller was cancelled and gave the attempt up: not a grant.
            discard(backend, self.key, token)
            return False
        try:
            heartbeat().add(lease)
            if lock_acquired.receivers:
                lease.announce(lock_acquired)
        except BaseException:
            # Whatever stops us here (KeyboardInterrupt, a receiver's
            # SystemExit) must not leave the key held until the ttl runs out.
            self._held = False
            self._end(lease)
            raise
        return True

    def _end(self, lease: Lease) -> None:
        if lease.pid != this_pid():
            return  # a forked child leaving the work: the lease is its parent's
        if release_after_transactions(lease, self._release_now):
            return  # held until the caller's transaction ends
        self._release_now(lease)

    def _release_now(self, lease: Lease) -> None:
        try:
            # With min_hold, a refresh under way must land before the release.
            heartbeat().remove(lease, wait=self.min_hold is not None)
        finally:  # even interrupted here, the lease is released
            send_release(lease, self.min_hold)
            if observe.observer is not None:
                observe.observer.released(lease)
