"""The lock object everything else wraps: acquire (waiting if asked), hold, release.

``run_exclusive``, ``arun_exclusive``, ``with lock``, ``async with lock`` (and
the decorator) are thin layers over :class:`Lock`. Its async methods
(:class:`AsyncLockMethods`: ``aacquire``, ``atry_acquire``, ``arelease`` and
``async with``) run the same synchronous steps off the event loop, one thread
at a time (``aio.off_loop``); only the pauses between looks at a held key are
``asyncio.sleep``. A caller cancelled while an attempt is under way leaves the
attempt to finish in its thread, and what it took is released (see
:class:`Attempt`); a release, once started, completes even if its caller is
cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, cast

from django_tasklock.backends import get_backend
from django_tasklock.backends.base import BaseBackend, HeldLock, Holder
from django_tasklock.backends.forksafe import ForkSafeLock
from django_tasklock.backends.listening import Watch
from django_tasklock.exceptions import LimitMismatch, LockLost, LockNotAcquired
from django_tasklock.leases import observe
from django_tasklock.leases.heartbeat import heartbeat
from django_tasklock.leases.lease import Lease, clock
from django_tasklock.leases.releasing import discard, discard_permit, send_release
from django_tasklock.leases.tokens import new_token, this_pid, this_process
from django_tasklock.locking import loss, wakeups
from django_tasklock.locking.aio import keep, off_loop, refuse_event_loop
from django_tasklock.locking.chosen import choose, remembered
from django_tasklock.locking.options import (
    LockOptions,
    check_lock_kwargs,
    validate_key,
    validate_limited_key,
)
from django_tasklock.locking.transactions import release_after_transactions
from django_tasklock.locking.waiting import Backoff
from django_tasklock.processes import holder_gone
from django_tasklock.signals import lock_acquired

if TYPE_CHECKING:
    from contextvars import Token
    from datetime import timedelta

    from typing_extensions import Self, Unpack

    from django_tasklock.leases.observe import Acquisition
    from django_tasklock.locking.aio import LossCanceller
    from django_tasklock.locking.options import LockKwargs

logger = logging.getLogger("django_tasklock")


class Attempt:
    """One attempt run off the loop, and whether its caller still awaits it.

    The caller, cancelled, gives the attempt up; the attempt, granted the key,
    makes the grant the lock's (``held``). Both take one mutex, so exactly one
    side sees to the release. Given up first, the attempt deletes its row
    itself, in its thread: that needs no event loop, which may be closing
    (``asyncio.run`` returning) while the attempt still waits for the storage.
    Made the lock's first, the lock is held when the caller's
    ``CancelledError`` is raised, and the caller's side releases it.

    The lock object stays its :class:`Acquirer`'s until the attempt is
    settled: dismissed by the attempt's thread when it ends given up, by the
    caller when it gives up an attempt already ended, and, for an attempt
    that never began (its task cancelled as the loop ended), by the caller's
    callback on that task. A grant made the lock's is dismissed at its release.
    """

    def __init__(self, acquirer: Acquirer) -> None:
        self._mutex = threading.Lock()
        self.acquirer = acquirer
        self.given_up = False
        self._owned = False
        self._began = False
        self._ended = False

    def give_up(self) -> tuple[bool, bool]:
        """The caller was cancelled: (the grant is the lock's already: release it, the
        attempt has ended: nothing will dismiss the acquirer but the caller)."""
        with self._mutex:
            self.given_up = True
            return self._owned, self._ended

    def begin(self) -> bool:
        """In the attempt's thread, before anything: False if given up already (do nothing)."""
        with self._mutex:
            if self.given_up:
                self._ended = True
                return False
            self._began = True
            return True

    def end(self) -> bool:
        """In the attempt's thread, when it is over: True if given up meanwhile."""
        with self._mutex:
            self._ended = True
            return self.given_up

    def never_began(self) -> bool:
        """Its task is done (on the loop): True if the attempt never began (nor will)."""
        with self._mutex:
            if self._began or self._ended:
                return False
            self._ended = True  # begin() will find it given up and do nothing
            return True

    def own(self, hold: Callable[[], None]) -> bool:
        """In the attempt's thread, granted: ``hold()`` unless given up; False if given up."""
        with self._mutex:
            if self.given_up:
                return False
            hold()
            self._owned = True
            return True


class Acquirer:
    """One acquisition of a lock object: the object's, from the acquisition's start
    until it ends without a grant or its grant is released (see :meth:`Lock._admit`).

    A second acquisition of the same object meanwhile is refused. ``pid``: an
    acquirer copied into a forked child, by a thread that is not there, is stale.
    """

    __slots__ = ("handed_on", "pid", "site")

    def __init__(self, site: tuple[str, int, str] | None) -> None:
        self.pid = this_pid()
        #: Dismissed by the attempt given up (see :class:`Attempt`), not by the caller.
        self.handed_on = False
        #: Where the caller acquires: file, line, function (see :func:`_caller`).
        self.site = site


#: Frames of this package's files are not where a lock was acquired.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _caller() -> tuple[str, int, str] | None:
    """Where the caller acquires: the innermost frame outside this package."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name


def _dropped(lease: Lease, site: tuple[str, int, str] | None) -> None:
    """A held lock object was garbage-collected: its lease is to be refreshed no more.

    Only marks it (the heartbeat warns and stops at its next due time): a
    collection may run on any thread, in the middle of anything, even the
    heartbeat's own steps, so this takes no lock and makes no call (not even
    ``this_pid()``, which may run the fork hooks).
    """
    if not lease.closed and lease.pid == os.getpid():
        lease.dropped = site or ("an unknown place", 0, "?")


#: Guards every lock object's acquirer: held for a test and a store, never across a call.
_admitting = ForkSafeLock()


class AsyncLockMethods(loss.ActsOnLoss):
    """The async methods :class:`Lock` inherits, with acting on a loss."""

    wait: timedelta
    fence: int | None
    limit: int
    #: The async attempt under way in this lock's thread (None: a sync acquisition).
    _attempt: Attempt | None = None
    _acquirer: Acquirer | None
    #: While held: what marks the lease dropped if this object is collected.
    _dropped: weakref.finalize[[Lease, tuple[str, int, str] | None], AsyncLockMethods] | None

    def _woken(self) -> None:
        """The key was released in another process (told by the storage): its waiters look."""
        wakeups.released(self.key)

    def _watch(self, backend: BaseBackend, watching: contextlib.ExitStack) -> Watch:
        """The backend's watch of the key for this wait; one never ready if it fails.

        A ``limit=N`` key's too: the release of any of its permits is told
        under the key (PostgreSQL's notification and Redis's signal name it).
        """
        try:
            return watching.enter_context(backend.watch(self.key, self._woken))
        except Exception:
            logger.warning(
                "Task lock %r: its storage cannot tell this waiter of a release; it polls.",
                self.key,
                exc_info=True,
            )
            return Watch(None, self.key)

    if TYPE_CHECKING:  # the synchronous steps, defined by Lock

        def _ready(self) -> BaseBackend: ...

        def _try_once(
            self, backend: BaseBackend, look_first: bool
        ) -> tuple[bool, float | None]: ...

        def release(self) -> None: ...

        def _admit(self) -> Acquirer: ...

        def _dismiss(self, acquirer: Acquirer | None = None) -> None: ...

    async def aacquire(self) -> Self:
        """:meth:`acquire` without blocking the event loop."""
        self._no_cancel_on_loss()
        if not await self._atry_acquire():
            raise LockNotAcquired(self.key, self.wait or None)
        return self

    async def atry_acquire(self) -> bool:
        """:meth:`try_acquire` without blocking the event loop.

        Cancelling the awaiting task while an attempt is under way lets the
        attempt finish in its thread and releases what it took.
        """
        self._no_cancel_on_loss()
        return await self._atry_acquire()

    async def _atry_acquire(self) -> bool:
        acquirer = self._admit()
        try:
            backend = self._ready()
            if observe.observer is None:
                return await self._atake(backend, None, acquirer)
            with observe.observer.acquiring(cast("Lock", self), backend) as seen:
                return seen.granted(await self._atake(backend, seen, acquirer))
        finally:
            if not self._held and not acquirer.handed_on:
                self._dismiss(acquirer)

    async def _atake(
        self, backend: BaseBackend, seen: Acquisition | None, acquirer: Acquirer
    ) -> bool:
        if not self.wait:  # one try: nothing to be woken for
            return await self._await_turns(backend, seen, acquirer, None, None)
        with wakeups.alistening(self.key) as woken, contextlib.ExitStack() as watching:
            return await self._await_turns(backend, seen, acquirer, woken, watching)

    async def _await_turns(
        self,
        backend: BaseBackend,
        seen: Acquisition | None,
        acquirer: Acquirer,
        woken: asyncio.Event | None,
        watching: contextlib.ExitStack | None,
    ) -> bool:
        backoff = Backoff(self.wait)
        look_first = waited = False
        watch: Watch | None = None  # other processes' releases: watched from the first pause
        while True:
            if woken is not None:
                woken.clear()  # before the look: a release after it ends the pause below
            told = watch is not None and watch.ready  # before the look, as woken
            attempt = Attempt(acquirer)
            # Kept (aio.keep): it finishes, and is waited for, whatever becomes of us.
            running = keep(off_loop(self._attempt_once)(backend, look_first, attempt))
            try:
                acquired, seconds_left = await asyncio.shield(running)
            except asyncio.CancelledError:
                owned, ended = attempt.give_up()
                if owned:  # granted as the cancellation landed: its release dismisses us
                    keep(self._undo(running, self._lease))
                elif not ended:  # dismissed once the attempt is settled (see Attempt)
                    acquirer.handed_on = True
                    running.add_done_callback(functools.partial(self._never_began, attempt))
                raise
            if acquired:
                return True
            if seconds_left is None and waited and self.limit == 1:  # as in _take
                seconds_left = 0.0
            pause = backoff.next_pause(seconds_left, told=told)
            if pause is None:
                return False
            assert woken is not None  # a pause: wait= is set
            assert watching is not None
            if watch is None:  # the backend is in use by now: no connection made here
                watch = self._watch(backend, watching)
            if seen is not None and not waited:
                seen.waiting()
            waited = True
            look_first = not await wakeups.asleep(woken, pause)  # as in _take

    async def arelease(self) -> None:
        """:meth:`release` off the event loop; it completes even if the caller is cancelled.

        Queued behind a release of the same grant that has not started yet (one
        whose caller was cancelled), this one does nothing; once that release
        has begun, the lock is no longer held and this raises ``RuntimeError``.
        """
        if self._lease is None or not self._held:
            raise RuntimeError(f"task lock {self.key!r} is not held")
        await asyncio.shield(keep(off_loop(self._release_if_held)(self._lease)))

    async def __aenter__(self) -> Self:
        if not await self._atry_acquire():
            raise LockNotAcquired(self.key, self.wait or None)
        self.enter_body()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stopped = self.leave_body(exc)
        lease = self._lease  # this acquisition's: once released, the object may be another's
        await self.arelease()
        found_by_release = self.cancel_on_loss and lease is not None and lease.lost
        if stopped is None and exc is None and found_by_release:
            # Only the release found the loss: the result was made without the lock.
            assert lease is not None
            stopped = LockLost(self.key, lease.reason)
        if stopped is not None:
            raise stopped from exc

    def _attempt_once(
        self, backend: BaseBackend, look_first: bool, attempt: Attempt
    ) -> tuple[bool, float | None]:
        """``_try_once`` in the lock's thread, for ``attempt`` (see :class:`Attempt`)."""
        if not attempt.begin():
            # Its caller was cancelled before it began: nothing asked.
            self._dismiss(attempt.acquirer)
            return False, None
        self._attempt = attempt
        try:
            return self._try_once(backend, look_first)
        finally:
            self._attempt = None
            if attempt.end() and not self._held:
                self._dismiss(attempt.acquirer)  # given up, and nothing of it is held

    def _never_began(self, attempt: Attempt, task: object) -> None:
        """On the loop, once the task of a given-up attempt is done (see :class:`Attempt`)."""
        if attempt.never_began():
            self._dismiss(attempt.acquirer)

    def _own(self, lease: Lease, fence: int | None) -> bool:
        """Make a grant this lock's (``held``); False if its async caller gave the attempt up."""
        attempt = self._attempt
        if attempt is None:
            self._hold(lease, fence)
            return True
        return attempt.own(lambda: self._hold(lease, fence))

    def _hold(self, lease: Lease, fence: int | None) -> None:
        self._lease, self._held, self.fence = lease, True, fence
        acquirer = self._acquirer
        site = acquirer.site if acquirer is not None else None
        # Collected while held (never released): the heartbeat lets its lease run out.
        self._dropped = weakref.finalize(self, _dropped, lease, site)
        self._dropped.atexit = False

    async def _undo(
        self, attempt: asyncio.Future[tuple[bool, float | None]], lease: Lease | None
    ) -> None:
        """Release the grant an attempt made the lock's as its caller was cancelled.

        The caller's own clean-up (``if lock.held: await lock.arelease()``)
        sees the grant too: whichever comes second finds the lease released
        and does nothing.
        """
        await asyncio.wait([attempt])  # its end (heartbeat, signal), not its outcome
        await off_loop(self._release_if_held)(lease)

    def _release_if_held(self, lease: Lease | None) -> None:
        # Run where every step of this lock runs (``off_loop``: one thread at a
        # time), so the check and the release are never interleaved with
        # another release; ``lease`` is the grant the abandoned attempt made the lock's.
        if self._held and self._lease is lease:
            self.release()


class Lock(AsyncLockMethods):
    """A lease lock on one key: ``with``, ``async with``, or ``acquire()``/``release()``.

    Made by :meth:`TaskLockService.lock` (or ``django_tasklock.lock``); every
    option is validated here, before anything is written. A Lock object
    holds the key at most once at a time and may be acquired again after it
    is released (each time with a new token). It has one acquirer at a time:
    from the start of an acquisition until it ends without a grant or its
    grant is released, another acquisition of the same object (another
    thread's or task's, or the holder's own) raises ``RuntimeError`` before
    any storage call. Threads or tasks that take the key each make a Lock.

    While held: ``holder`` is who holds it (this host and pid), ``lost``
    turns True if the lease is lost (expired, taken over, force-released,
    ``max_lifetime`` passed), and ``fence`` is the grant's fencing token when
    ``fencing=True``. With ``limit=N`` (2 or more) up to N holders hold the
    key at once, each one of its permits (``permit``: which one), a lease of
    its own whose every storage call names the permit; a backend without
    ``capabilities.permits`` raises ``NotImplementedError`` before any write.
    ``limit=1`` (the default) makes exactly a mutex's storage calls.

    Acting on a loss: ``raise_if_lost()``, ``lost_event``, ``wait_lost()``,
    ``progress()`` (see :class:`~django_tasklock.locking.loss.ActsOnLoss`),
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
        #: At most this many holders of the key at once (``limit=``; 1: a mutex).
        self.limit = chosen.limit
        validate_limited_key(self.key, self.limit)
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
        self._takes: tuple[Lease | None, int] = (None, 0)  # take_rerun's last, of which lease
        self._held = False
        #: The holder seen by the last look at the key that found it held (see skipped).
        self.seen: HeldLock | None = None
        self._context: Token[loss.Holding | None] | None = None
        self._canceller: LossCanceller | None = None
        #: The acquisition under way, or holding the key, through this object.
        self._acquirer: Acquirer | None = None
        self._dropped = None

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
    def permit(self) -> int | None:
        """With ``limit`` of 2 or more, which of the key's permits the grant holds
        (from 0; kept after release, as ``holder``); None for a mutex or before a grant."""
        return self._lease.permit if self._lease is not None else None

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
            Exception: the storage's own error when it cannot be reached (never
                "not acquired").
        """
        if not self.try_acquire():
            raise LockNotAcquired(self.key, self.wait or None)
        return self

    def try_acquire(self) -> bool:
        """Like :meth:`acquire`, but False instead of ``LockNotAcquired``."""
        self._no_cancel_on_loss()
        refuse_event_loop(self.key, "with lock / acquire()", "async with lock / aacquire()")
        acquirer = self._admit()
        try:
            backend = self._ready()
            if observe.observer is None:
                return self._take(backend, None)
            with observe.observer.acquiring(self, backend) as seen:
                return seen.granted(self._take(backend, seen))
        finally:
            if not self._held:  # ended without a grant (or its grant undone)
                self._dismiss(acquirer)

    def _take(self, backend: BaseBackend, seen: Acquisition | None) -> bool:
        if not self.wait:  # one try, as a Backoff of no time would allow
            self.seen = None  # see _try_once
            return self._grant(backend)
        backoff = Backoff(self.wait)
        look_first = waited = False
        with wakeups.listening(self.key) as woken, contextlib.ExitStack() as watching:
            watch: Watch | None = None  # other processes' releases: watched from the first pause
            while True:
                woken.clear()  # before the look: a release after it ends the pause below
                told = watch is not None and watch.ready  # before the look, as woken
                acquired, seconds_left = self._try_once(backend, look_first)
                if acquired:
                    return True
                if seconds_left is None and waited and self.limit == 1:
                    # Its INSERT lost to another's (woken with others): how long
                    # that lease has left is unknown, so the next look, a read,
                    # comes at once (within the jitter), not after the backoff.
                    # (A limited key's looks are all requests: they keep the backoff.)
                    seconds_left = 0.0
                pause = backoff.next_pause(seconds_left, told=told)
                if pause is None:
                    return False
                if watch is None:
                    watch = self._watch(backend, watching)
                if seen is not None and not waited:
                    seen.waiting()
                waited = True
                # Woken by a release, the key is most likely free: ask for it at
                # once. Otherwise read before writing (see _try_once).
                look_first = not woken.wait(pause)

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
        self._let_go()
        try:
            self._end(lease)
        finally:
            self._dismiss()

    def take_rerun(self) -> str | None:
        """While held and not lost: take the key's "run once more" mark (``on_locked="rerun"``).

        Its payload when a skipped call marked the key since the last take
        (the caller then runs its work again, still holding the key); None
        when unmarked, lost or not held. One storage call while held.
        """
        lease = self._lease
        if lease is None or not self._held or lease.lost:
            return None
        # The takes of one lease are numbered 1, 2, 3...: a copy of one arriving
        # late, after a later take, takes nothing (``BaseBackend.take_rerun``).
        taken = self._takes[1] + 1 if self._takes[0] is lease else 1
        self._takes = (lease, taken)
        return self.backend.take_rerun(lease.key, lease.token, taken)

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

    def _admit(self) -> Acquirer:
        """Make this object one acquisition's, or raise ``RuntimeError`` if it has one.

        Atomic (one mutex for every lock object, held for a test and a store):
        of two threads or tasks acquiring the same object at once, one goes on
        and the other is refused before it asks the storage anything. An
        acquisition a forked child inherited from a thread of its parent's,
        which is not there, is stale, unless its grant is held (then, as
        before, the object is held).
        """
        acquirer = Acquirer(_caller())
        with _admitting:
            current = self._acquirer
            if current is None or (current.pid != acquirer.pid and not self._held):
                if current is not None:
                    self._attempt = None  # the parent's, in a thread not copied here
                self._acquirer = acquirer
                return acquirer
            state = "held" if self._held else "being acquired or released"
        raise RuntimeError(
            f"task lock {self.key!r} is already {state} through this Lock object (by this "
            f"or another thread or task): a Lock object has one acquirer at a time, so make "
            f"one lock(...) per acquirer, e.g. inside the function each thread or task runs, "
            f"and acquire an object again only after its release"
        )

    def _dismiss(self, acquirer: Acquirer | None = None) -> None:
        """``acquirer`` (default: whichever the object has) is done with the object."""
        with _admitting:
            if acquirer is None or self._acquirer is acquirer:
                self._acquirer = None

    def _ready(self) -> BaseBackend:
        backend = self.backend
        if self.fencing and type(backend).fence is BaseBackend.fence:
            raise NotImplementedError(
                f"fencing=True needs a backend with fencing tokens; "
                f"{type(backend).__name__} has none"
            )
        if self.limit > 1 and not backend.capabilities.permits:
            raise NotImplementedError(
                f"limit={self.limit} needs a backend that gives permits "
                f"(capabilities.permits); {type(backend).__name__} gives none"
            )
        return backend

    def _try_once(self, backend: BaseBackend, look_first: bool) -> tuple[bool, float | None]:
        """One look at the key: (acquired, seconds the holder's lease has left if seen).

        A waiter that polls reads before it writes (``look_first``): while the
        key is held, a look costs one read and no failed INSERT (which
        PostgreSQL would log as an error). One woken by a release writes at
        once: the key is most likely free, and the read would only delay the
        grant; if another waiter took it first, its INSERT fails.
        """
        if look_first and self.limit == 1:
            # (A limited key has no lease of its own to look at: its waiters ask.)
            held = backend.peek(self.key)
            if held is not None and not _taken_over(backend, held):
                self.seen = held
                return False, held.seconds_left
        self.seen = None  # an insert that fails says nothing of who holds the key
        return self._grant(backend), None

    def _new_token(self) -> str:
        """The token of the next grant (a subclass may hand over one issued before)."""
        return new_token()

    def _ask(self, backend: BaseBackend, lease: Lease) -> bool:
        """Ask the storage for ``lease`` (not yet granted); True when granted.

        With ``limit`` of 2 or more, for one of the key's permits: granted,
        ``lease.stored_as`` becomes the permit's name.
        """
        if self.limit == 1:
            return backend.acquire(
                self.key, lease.token, ttl=self.options.ttl, max_lifetime=self.options.max_lifetime
            )
        name = backend.acquire_permit(
            self.key,
            lease.token,
            limit=self.limit,
            ttl=self.options.ttl,
            max_lifetime=self.options.max_lifetime,
        )
        if name is None:
            return False
        lease.stored_as = name
        return True

    def _discard(self, backend: BaseBackend, lease: Lease) -> None:
        """Delete ``lease`` if it was granted: by its name, or, for a permit whose
        request raised (its reply lost: which permit is unknown), by every permit's."""
        if self.limit > 1 and lease.permit is None:
            discard_permit(backend, self.key, lease.token, self.limit)
        else:
            discard(backend, lease.stored_as, lease.token)

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
            granted = self._ask(backend, lease)
            fence = backend.fence(lease.stored_as, token) if granted and self.fencing else None
        except LimitMismatch:
            if self.limit == 1:
                discard(backend, self.key, token)
            raise  # a permit refused: nothing was written
        except BaseException:
            self._discard(backend, lease)
            raise
        if not granted:
            return False
        if self.fencing and fence is None:
            # Expired before it was fenced: not a grant. Clear our row if left.
            discard(backend, lease.stored_as, token)
            return False
        if not self._own(lease, fence):
            # Its async caller was cancelled and gave the attempt up: not a grant.
            discard(backend, lease.stored_as, token)
            return False
        try:
            heartbeat().add(lease)
            if lock_acquired.receivers:
                lease.announce(lock_acquired)
        except BaseException:
            # Whatever stops us here (KeyboardInterrupt, a receiver's
            # SystemExit) must not leave the key held until the ttl runs out.
            self._held = False
            self._let_go()
            self._end(lease)
            raise
        return True

    def _let_go(self) -> None:
        """Released: collecting this object no longer concerns the lease."""
        if self._dropped is not None:
            self._dropped.detach()
            self._dropped = None

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
            wakeups.released(self.key)
            if observe.observer is not None:
                observe.observer.released(lease)


def _taken_over(backend: BaseBackend, held: HeldLock) -> bool:
    """Whether ``backend``'s ``acquire`` takes over ``held`` now: its holder is gone."""
    return backend.capabilities.dead_holders and holder_gone(held.holder) is True


def current_lock() -> Lock | None:
    """The lock the running code holds: of the innermost ``@exclusive``, ``with lock``,
    ``async with lock``, ``run_exclusive`` or ``arun_exclusive`` around it, else None.

    Kept in a context variable, so it follows the code into ``await``\\ ed
    coroutines and ``asgiref``'s ``sync_to_async``, and is not seen by other
    threads or asyncio tasks (a task created inside copies it, like any
    context variable).
    """
    return cast("Lock | None", loss.current())
