"""``on_locked="rerun"``: a call that finds its key held marks it, and the holder runs once more.

The skipped call marks the key in the storage (``mark_rerun``: only while a
live lease holds it) and returns at once, reported as skipped with the
outcome ``"rerun"``. The holder, when its work is done and before it lets
go, takes the mark (``take_rerun``, bound to its token) and runs the work
again, still holding the key; as often as it finds a new mark. Many calls
skipped during one run make one more run, which starts after the last of
them marked the key, so it sees every change made before them.

A skipped call that runs in a task of a framework whose integration can
send it (a :class:`Sender`, registered by ``django_tasklock.contrib.reruns``)
marks the key with its call (the task's name and arguments, as JSON): the
holder then lets go and sends that call once more (the latest skipped call's),
instead of running its own work again in-line. A call that cannot be so
described (no such task runs, or its arguments are not JSON) marks the key
with nothing, and the holder runs its own work again.

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

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

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


@dataclasses.dataclass(frozen=True)
class Sender:
    """How a task framework's integration sends a skipped task call once more.

    ``describe()``: the call of this framework's task running now, as
    JSON-able fields (its name, its arguments...), or None when none runs.
    ``send(fields)``: enqueue the call ``describe`` gave (in another process:
    the holder's); it raises when it cannot.
    """

    framework: str
    describe: Callable[[], dict[str, Any] | None]
    send: Callable[[dict[str, Any]], None]


_senders: dict[str, Sender] = {}


def register_sender(sender: Sender) -> None:
    """Let skipped calls in ``sender.framework``'s tasks be sent once more (see the module)."""
    _senders[sender.framework] = sender


def running_call() -> str:
    """A skipped call's mark: the running task's call, as its framework describes it, or
    "" (the holder runs its own work again) when none can."""
    for sender in list(_senders.values()):
        fields = sender.describe()
        if fields is None:
            continue
        try:
            return json.dumps({"framework": sender.framework, **fields})
        except (TypeError, ValueError):
            logger.debug("The %s task call has arguments JSON cannot hold.", sender.framework)
            return ""
    return ""


def _sendable(payload: str) -> tuple[Sender, dict[str, Any]] | None:
    """The sender of the call a mark carries, and the call; None for "" or an unknown one."""
    if not payload:
        return None
    try:
        call = json.loads(payload)
    except ValueError:
        return None
    sender = _senders.get(str(call.get("framework"))) if isinstance(call, dict) else None
    return None if sender is None else (sender, call)


def _send(lock: Lock, name: str, sender: Sender, call: dict[str, Any]) -> None:
    """Send ``call`` once more (the key let go); a failure is logged, never raised."""
    try:
        sender.send(call)
    except Exception:
        logger.exception(
            "Sending the %s task call marked on task lock %r once more failed: it will not "
            "run again until the key is marked again.",
            sender.framework,
            lock.key,
        )
        return
    logger.info(
        "Sent %s once more, as the %s task %s with the latest skipped call's arguments: "
        "task lock %r was marked while it ran.",
        name,
        sender.framework,
        call.get("task"),
        lock.key,
    )


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
    call = running_call()
    for _ in range(_ATTEMPTS):
        if lock.try_acquire():
            return ACQUIRED
        if lock.backend.mark_rerun(lock.key, call):
            report_skipped(lock, name, RERUN)
            return RERUN
    # Free when marked, held when taken, each time: every run since started after this call.
    report_skipped(lock, name)
    return SKIPPED


async def atake_or_mark(lock: Lock, name: str) -> str:
    """:func:`take_or_mark` for asyncio: storage calls in a worker thread."""
    call = running_call()
    for _ in range(_ATTEMPTS):
        if await lock.atry_acquire():
            return ACQUIRED
        if await off_loop(lock.backend.mark_rerun)(lock.key, call):
            await off_loop(report_skipped)(lock, name, RERUN)
            return RERUN
    await off_loop(report_skipped)(lock, name)
    return SKIPPED


_Call = tuple[Sender, dict[str, Any]]


def run_marked(lock: Lock, work: Callable[[], T], name: str) -> T:
    """Holding ``lock``: run ``work``, then once more per mark taken, and release; a mark
    that carries a task call is sent once more after the release instead.

    Returns the last run's result; an exception from ``work`` propagates
    after the release (any mark stays, for the next holder).
    """
    try:
        result, to_send = _drain(lock, work, name, work())
    finally:
        if lock.held:
            lock.release()
    while to_send is None and _marked_after_release(lock) and lock.try_acquire():
        try:  # a mark came between the last take and the release: holding again
            result, to_send = _drain(lock, work, name, result)
        finally:
            if lock.held:
                lock.release()
    if to_send is not None:
        _send(lock, name, *to_send)
    return result


def _drain(lock: Lock, work: Callable[[], T], name: str, result: T) -> tuple[T, _Call | None]:
    """Holding: take marks, running ``work`` again for each that carries no task call;
    stop at one that does (returned, to send once the key is let go)."""
    while (payload := lock.take_rerun()) is not None:
        to_send = _sendable(payload)
        if to_send is not None:
            return result, to_send
        _again(lock, name)
        result = work()
    return result, None


async def arun_marked(lock: Lock, work: Callable[[], Awaitable[T]], name: str) -> T:
    """:func:`run_marked` for asyncio."""
    try:
        result, to_send = await _adrain(lock, work, name, await work())
    finally:
        if lock.held:
            await lock.arelease()
    while (
        to_send is None
        and await off_loop(_marked_after_release)(lock)
        and await lock.atry_acquire()
    ):
        try:
            result, to_send = await _adrain(lock, work, name, result)
        finally:
            if lock.held:
                await lock.arelease()
    if to_send is not None:
        await off_loop(_send)(lock, name, *to_send)
    return result


async def _adrain(
    lock: Lock, work: Callable[[], Awaitable[T]], name: str, result: T
) -> tuple[T, _Call | None]:
    """:func:`_drain` for asyncio."""
    while (payload := await off_loop(lock.take_rerun)()) is not None:
        to_send = _sendable(payload)
        if to_send is not None:
            return result, to_send
        _again(lock, name)
        result = await work()
    return result, None


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
