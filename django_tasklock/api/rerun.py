"""``on_locked="rerun"``: a call that finds its key held marks it, and the holder runs once more.

The skipped call marks the key in the storage (``mark_rerun``: only while a
live lease holds it) and returns at once, reported as skipped with the
outcome ``"rerun"``. The holder, when its work is done and before it lets
go, takes the mark (``take_rerun``, bound to its token) and runs the work
again, still holding the key; as often as it finds a new mark. Many calls
skipped during one run make one more run, which starts after the last of
them marked the key, so it sees every change made before them.

A mark written between the holder's last take and its release is on a key
nobody holds: the holder looks once more after the release, takes the key
again and runs (unless another caller took the key first: that caller's run
starts after the mark, and takes it in turn). A call that finds the key free
by the time it marks takes the key itself. A holder that loses its lease,
raises, or dies leaves the mark to the key's next holder, who takes it when
its own run ends and runs once more. Inside the caller's
``transaction.atomic()``, whose end the release waits for, that last look is
not made: a mark written in that moment waits for the next holder.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from django.db import connections

from django_tasklock.api.skipped import RERUN, RETRY, SKIPPED, report_skipped
from django_tasklock.locking.aio import off_loop

if TYPE_CHECKING:
    from django_tasklock.locking.lock import Lock

T = TypeVar("T")

logger = logging.getLogger("django_tasklock")

#: Tries at taking or marking a key that keeps changing hands under the call.
_ATTEMPTS = 3


def wants_rerun(on_locked: object) -> bool:
    """Whether ``on_locked`` is ``"rerun"``; ``ValueError`` for any other string
    (``"retry"`` is ``@exclusive``'s only: its tasks can return what retries them)."""
    if not isinstance(on_locked, str):
        return False
    if on_locked == RETRY:
        raise ValueError(
            "on_locked='retry' is for tasks under @exclusive(...): run_exclusive takes "
            "a callable, 'rerun', or nothing"
        )
    if on_locked != RERUN:
        raise ValueError(f"on_locked must be a callable or 'rerun', got {on_locked!r}")
    return True


def check_rerun(lock: Lock) -> None:
    """Refuse, before anything is written, what ``on_locked="rerun"`` cannot serve."""
    if lock.limit > 1:
        raise ValueError(
            f"on_locked='rerun' marks a mutex's key (limit=1), got limit={lock.limit}"
        )
    if lock.min_hold is not None:
        raise ValueError(
            "on_locked='rerun' cannot be combined with min_hold: a key kept held after "
            "its work is done has no holder to run it once more"
        )
    backend = lock.backend
    if not backend.capabilities.rerun:
        raise NotImplementedError(
            f"on_locked='rerun' needs a backend that can mark a key (capabilities.rerun); "
            f"{type(backend).__name__} cannot"
        )


#: What :func:`take_or_mark` did: took the key (else ``RERUN`` or ``SKIPPED``).
ACQUIRED = "acquired"


def take_or_mark(lock: Lock, name: str) -> str:
    """Take ``lock``'s key (:data:`ACQUIRED`), or mark it "run once more" and report the
    skip (``RERUN``); ``SKIPPED`` when the key changed hands under every try."""
    for _ in range(_ATTEMPTS):
        if lock.try_acquire():
            return ACQUIRED
        if lock.backend.mark_rerun(lock.key, ""):
            report_skipped(lock, name, RERUN)
            return RERUN
    # Free when marked, held when taken, each time: every run since started after this call.
    report_skipped(lock, name)
    return SKIPPED


async def atake_or_mark(lock: Lock, name: str) -> str:
    """:func:`take_or_mark` for asyncio: storage calls in a worker thread."""
    for _ in range(_ATTEMPTS):
        if await lock.atry_acquire():
            return ACQUIRED
        if await off_loop(lock.backend.mark_rerun)(lock.key, ""):
            await off_loop(report_skipped)(lock, name, RERUN)
            return RERUN
    await off_loop(report_skipped)(lock, name)
    return SKIPPED


def run_marked(lock: Lock, work: Callable[[], T], name: str) -> T:
    """Holding ``lock``: run ``work``, once more per mark taken, then release.

    Returns the last run's result; an exception from ``work`` propagates
    after the release (any mark stays, for the next holder).
    """
    while True:
        try:
            result = work()
            while lock.take_rerun() is not None:
                _again(lock, name)
                result = work()
        finally:
            if lock.held:
                lock.release()
        if not _marked_after_release(lock) or not lock.try_acquire():
            return result
        if lock.take_rerun() is None:  # taken by the holder before us
            lock.release()
            return result
        _again(lock, name)


async def arun_marked(lock: Lock, work: Callable[[], Awaitable[T]], name: str) -> T:
    """:func:`run_marked` for asyncio."""
    while True:
        try:
            result = await work()
            while await off_loop(lock.take_rerun)() is not None:
                _again(lock, name)
                result = await work()
        finally:
            if lock.held:
                await lock.arelease()
        if not await off_loop(_marked_after_release)(lock) or not await lock.atry_acquire():
            return result
        if await off_loop(lock.take_rerun)() is None:
            await lock.arelease()
            return result
        _again(lock, name)


async def as_body(lock: Lock, work: Callable[[], Awaitable[T]]) -> T:
    """``await work()`` as the body of ``async with lock`` runs: ``current_lock()`` is
    ``lock``, and with ``cancel_on_loss`` a loss stops it with ``LockLost``."""
    lock.enter_body()
    error: BaseException | None = None
    try:
        return await work()
    except BaseException as exc:
        error = exc
        raise
    finally:
        stopped = lock.leave_body(error)
        if stopped is not None:
            raise stopped from error  # the loss stopped the work


def _marked_after_release(lock: Lock) -> bool:
    """Whether a mark came between the last take and the release (then it is on a free key)."""
    if lock.lost or any(c.in_atomic_block for c in connections.all(initialized_only=True)):
        return False
    return bool(lock.backend.rerun_marks(lock.key))


def _again(lock: Lock, name: str) -> None:
    logger.info(
        "Running %s once more: task lock %r was marked by a call skipped while it ran.",
        name,
        lock.key,
    )
