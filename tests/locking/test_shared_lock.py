"""One Lock object, one acquirer: a second acquisition of the same object is refused up front.

The case a review reproduced: a module-level ``lock("nightly", wait=...)``
entered by a thread pool. Two threads waited on the one object; A was
granted; an operator force-released A's lease; B, still waiting on the same
object, was granted and overwrote the object's lease, so A's exit released
B's lease, a third caller was granted while B still worked, B's ``lost``
stayed False and B's own exit raised ``RuntimeError``. Now the second
acquisition of an object that is being acquired or is held raises
``RuntimeError`` at once, before any storage call, naming the key and the fix.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from django_tasklock import TaskLockService, lock_acquired
from django_tasklock.backends.base import BaseBackend, HeldLock, lease_id
from django_tasklock.backends.memory import MemoryBackend
from django_tasklock.leases.lease import new_token
from django_tasklock.locking import aio
from django_tasklock.locking.lock import Lock
from django_tasklock.testing import ContractBackend
from django_tasklock.testing.delegate import DelegatingBackend

#: A generous bound for a condition on a loaded machine; never a pause.
PATIENCE = 10.0
LONG, LIFE = timedelta(seconds=30), timedelta(hours=1)
REFUSED = "refused up front"


class Watched(DelegatingBackend):
    """``inner``'s answers; which thread asked what, with a condition to wait on."""

    def __init__(self, inner: BaseBackend) -> None:
        super().__init__(inner)
        self.asked: list[tuple[str, str]] = []
        self.changed = threading.Condition()

    def note(self, call: str | None = None) -> None:
        with self.changed:
            if call is not None:
                self.asked.append((threading.current_thread().name, call))
            self.changed.notify_all()

    def calls(self, thread: str | None = None, call: str | None = None) -> list[str]:
        with self.changed:
            return [
                what
                for who, what in self.asked
                if (thread is None or who == thread) and (call is None or what == call)
            ]

    def wait_for(self, condition: Callable[[], object]) -> bool:
        with self.changed:
            return bool(self.changed.wait_for(condition, PATIENCE))

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        self.note("acquire")
        return super().acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)

    def peek(self, key: str) -> HeldLock | None:
        self.note("peek")
        return super().peek(key)

    def release(self, key: str, token: str, *, min_hold: timedelta | None = None) -> bool:
        self.note("release")
        return super().release(key, token, min_hold=min_hold)


class Acquirer(threading.Thread):
    """``with shared:`` in a thread of its own name; in the block until ``leave`` is set."""

    def __init__(self, name: str, shared: Lock, watched: Watched) -> None:
        super().__init__(name=name, daemon=True)
        self.shared, self.watched = shared, watched
        self.entered, self.leave = threading.Event(), threading.Event()
        self.done = False
        self.token: str | None = None
        self.outcome = "still in the block"
        self.lost_after: bool | None = None

    def run(self) -> None:
        try:
            with self.shared:
                assert self.shared._lease is not None
                self.token = self.shared._lease.token
                self.entered.set()
                self.watched.note()
                self.leave.wait(6 * PATIENCE)
            self.outcome = "released"
            self.lost_after = self.shared.lost
        except BaseException as exc:
            self.outcome = refusal(exc, self.shared.key)
        finally:
            self.watched.inner.close()  # this thread's connections
            self.done = True
            self.watched.note()


def refusal(exc: BaseException, key: str) -> str:
    """``REFUSED`` for the refusal that names the key and the fix, else what was raised."""
    text = str(exc)
    if isinstance(exc, RuntimeError) and repr(key) in text and "one lock(...) per" in text:
        return REFUSED
    return f"{type(exc).__name__}: {text}"


def whose(held: HeldLock | None, **tokens: str | None) -> str:
    """Whose lease ``held`` is, by the names given to the tokens (or "free")."""
    if held is None:
        return "free"
    for name, token in tokens.items():
        if token is not None and held.lease == lease_id(token):
            return f"{name}'s"
    return f"someone else's ({held.lease})"


def test_a_thread_entering_a_lock_object_another_thread_acquires_is_refused_up_front(
    any_backend: ContractBackend, key: str
) -> None:
    # The module-level lock of the review, entered by two threads of a pool.
    watched = Watched(any_backend.backend)
    shared = TaskLockService(watched).lock(key, ttl=30, wait=6 * PATIENCE)
    outside = TaskLockService(any_backend.backend)
    blocker, third = outside.lock(key, ttl=30), outside.lock(key, ttl=30)
    assert blocker.try_acquire()  # so that A waits, with the object being acquired
    a, b, b2 = (Acquirer(name, shared, watched) for name in ("A", "B", "B2"))
    facts: dict[str, Any] = {}
    try:
        a.start()
        assert watched.wait_for(lambda: watched.calls("A", "peek")), "A never waited"
        b.start()
        # Refused (its thread ends), or, as before, waiting for the key beside A.
        assert watched.wait_for(lambda: b.done or watched.calls("B"))
        facts["B, entering while A acquires"] = b.outcome if b.done else "waits for the key"
        blocker.release()
        assert watched.wait_for(lambda: a.entered.is_set() or b.entered.is_set())
        first, other = (a, b) if a.entered.is_set() else (b, a)
        b2.start()
        assert watched.wait_for(lambda: b2.done or watched.calls("B2"))
        facts[f"B2, entering while {first.name} holds"] = b2.outcome
        facts["storage calls by B and B2"] = watched.calls("B") + watched.calls("B2")
        facts["the lease at the key"] = whose(any_backend.backend.peek(key), A=a.token, B=b.token)
        # An operator ends the holder's lease (manage.py tasklock release).
        assert any_backend.backend.force_release(key) is not None
        if not other.done:  # waiting on the same object all along: granted now
            watched.wait_for(lambda: other.entered.is_set() or other.done)
        facts["a third caller, after the force release"] = (
            "granted" if third.try_acquire() else "not granted"
        )
        first.leave.set()
        first.join(PATIENCE)
        facts[f"the key after {first.name}'s exit"] = whose(
            any_backend.backend.peek(key),
            A=a.token,
            B=b.token,
            third=third._lease.token if third._lease is not None else None,
        )
        if other.entered.is_set():
            facts[f"a third caller, while {other.name} works"] = (
                "granted" if third.held or third.try_acquire() else "not granted"
            )
            other.leave.set()
            other.join(PATIENCE)
        facts["held through the object by"] = [
            t.name for t in sorted((a, b), key=lambda t: t is other) if t.entered.is_set()
        ]
        facts["exits"] = {t.name: t.outcome for t in (a, b) if t.entered.is_set()}
        facts["lost after the exit"] = {t.name: t.lost_after for t in (a, b) if t.entered.is_set()}
    finally:
        for thread in (a, b, b2):
            thread.leave.set()
            thread.join(PATIENCE)
        for held in (blocker, third):
            if held.held:
                held.release()
    assert facts == {
        "B, entering while A acquires": REFUSED,
        "B2, entering while A holds": REFUSED,
        "storage calls by B and B2": [],  # refused before any
        "the lease at the key": "A's",  # A's grant, unchanged by the refusals
        "a third caller, after the force release": "granted",
        "the key after A's exit": "third's",  # A's exit released A's lease only
        "held through the object by": ["A"],
        "exits": {"A": "released"},
        "lost after the exit": {"A": True},  # the force release, found by the release
    }
    assert any_backend.backend.peek(key) is None


def test_a_task_entering_a_lock_object_another_task_acquires_is_refused_up_front(
    any_backend: ContractBackend, key: str
) -> None:
    watched = Watched(any_backend.backend)
    shared = TaskLockService(watched).lock(key, ttl=30, wait=6 * PATIENCE)
    blocker = new_token()
    assert any_backend.backend.acquire(key, blocker, ttl=LONG, max_lifetime=LIFE)
    peek = sync_to_async(any_backend.backend.peek)  # on the lock's thread, off the loop

    async def main() -> dict[str, Any]:
        facts: dict[str, Any] = {}
        entered, leave = asyncio.Event(), asyncio.Event()

        async def first() -> None:
            async with shared:
                entered.set()
                await leave.wait()

        async def second() -> None:
            async with shared:
                pass  # pragma: no cover - refused

        async def outcome(task: asyncio.Task[None]) -> str:
            done, _ = await asyncio.wait({task}, timeout=PATIENCE)
            if not done:
                return "waits for the key"
            error = task.exception()
            return "entered" if error is None else refusal(error, key)

        holder = asyncio.create_task(first())
        seconds: list[asyncio.Task[None]] = []
        try:
            waiting = await asyncio.to_thread(watched.wait_for, lambda: watched.calls(call="peek"))
            assert waiting, "the first task never waited"
            seconds.append(asyncio.create_task(second()))
            facts["second, entering while the first acquires"] = await outcome(seconds[-1])
            facts["acquisitions asked of the storage"] = len(watched.calls(call="acquire"))
            facts["the lease at the key"] = whose(await peek(key), blocker=blocker)
            await sync_to_async(any_backend.backend.force_release)(key)
            await asyncio.wait_for(entered.wait(), PATIENCE)
            seconds.append(asyncio.create_task(second()))
            facts["second, entering while the first holds"] = await outcome(seconds[-1])
            assert shared._lease is not None
            facts["the lease at the key, held"] = whose(await peek(key), first=shared._lease.token)
            leave.set()
            await asyncio.wait_for(holder, PATIENCE)
            facts["the key after the first's exit"] = whose(await peek(key))
        finally:
            for task in (holder, *seconds):
                task.cancel()
            await asyncio.wait({holder, *seconds, *aio._background}, timeout=PATIENCE)
            await sync_to_async(any_backend.backend.close)()  # the lock's thread's connection
        return facts

    assert asyncio.run(main()) == {
        "second, entering while the first acquires": REFUSED,
        "acquisitions asked of the storage": 1,  # the first task's first try; then reads
        "the lease at the key": "blocker's",
        "second, entering while the first holds": REFUSED,
        "the lease at the key, held": "first's",
        "the key after the first's exit": "free",
    }


def test_the_lock_object_acquires_again_after_its_release(
    any_backend: ContractBackend, key: str
) -> None:
    shared = TaskLockService(any_backend.backend).lock(key, ttl=30)
    tokens: list[str] = []

    def hold() -> None:
        with shared:
            assert shared._lease is not None
            tokens.append(shared._lease.token)

    def hold_in_a_thread() -> None:
        hold()
        any_backend.backend.close()  # this thread's connections

    hold()
    hold()
    other = threading.Thread(target=hold_in_a_thread)
    other.start()
    other.join(PATIENCE)

    async def main() -> None:
        async with shared:
            assert shared._lease is not None
            tokens.append(shared._lease.token)
        assert await shared.atry_acquire()
        assert shared._lease is not None
        tokens.append(shared._lease.token)
        await shared.arelease()
        await sync_to_async(any_backend.backend.close)()

    asyncio.run(main())
    with shared:  # a refused second acquisition leaves the holder's alone
        with pytest.raises(RuntimeError, match=r"one lock\(\.\.\.\) per acquirer"):
            shared.acquire()
        assert shared.held
        assert shared._lease is not None
        tokens.append(shared._lease.token)
    hold()
    assert len(tokens) == len(set(tokens)) == 7  # each time a new token
    assert not shared.held
    assert any_backend.backend.peek(key) is None


# -- a cancelled async acquisition frees the object once its attempt is settled -----------


class HeldUp(MemoryBackend):
    """An acquisition's answer, once the storage gave it, held up until ``answer`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.asked, self.answer = threading.Event(), threading.Event()

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        granted = super().acquire(key, token, ttl=ttl, max_lifetime=max_lifetime)
        self.asked.set()
        self.answer.wait(PATIENCE)
        return granted


async def _settled() -> None:
    """Until the lock's background work (attempts given up, their releases) has ended."""
    await asyncio.wait(set(aio._background), timeout=PATIENCE)
    assert not aio._background


def test_a_cancelled_acquisition_holds_the_object_until_its_attempt_is_settled() -> None:
    backend = HeldUp()
    shared = TaskLockService(backend).lock("cancelled", ttl=30)

    async def main() -> None:
        task = asyncio.create_task(shared.aacquire())
        await asyncio.to_thread(backend.asked.wait, PATIENCE)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The attempt still waits for its answer in the lock's thread: still claimed.
        with pytest.raises(RuntimeError, match="being acquired"):
            await shared.atry_acquire()
        backend.answer.set()  # granted; given up, the attempt deletes its lease itself
        await _settled()
        assert backend.list() == []
        assert not shared.held
        assert await shared.atry_acquire()  # the object is free again
        await shared.arelease()

    asyncio.run(main())
    assert backend.list() == []


def test_a_grant_that_arrived_as_its_acquisition_was_cancelled_is_released_then_freed() -> None:
    backend = MemoryBackend()
    shared = TaskLockService(backend).lock("granted-as-cancelled", ttl=30)
    granted, go_on = threading.Event(), threading.Event()

    def hold_up(sender: object, **kwargs: Any) -> None:
        if kwargs["key"] == "granted-as-cancelled" and not go_on.is_set():
            granted.set()
            go_on.wait(PATIENCE)

    async def main() -> None:
        task = asyncio.create_task(shared.atry_acquire())
        await asyncio.to_thread(granted.wait, PATIENCE)
        task.cancel()  # the grant is the lock's already (its receivers run in its thread)
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(RuntimeError, match="already held"):
            await shared.atry_acquire()
        go_on.set()
        await _settled()  # released as before
        assert backend.list() == []
        assert not shared.held
        assert await shared.atry_acquire()
        await shared.arelease()

    lock_acquired.connect(hold_up, weak=False)
    try:
        asyncio.run(main())
    finally:
        lock_acquired.disconnect(hold_up)
    assert backend.list() == []


def sleeping(task: asyncio.Task[Any]) -> bool:
    """``task`` is suspended in a waiter's pause (``wakeups.asleep``), nowhere else."""
    coroutine: Any = task.get_coro()
    names = [coroutine.cr_code.co_name]
    while asyncio.iscoroutine(getattr(coroutine, "cr_await", None)):
        coroutine = coroutine.cr_await
        names.append(coroutine.cr_code.co_name)
    return "asleep" in names


def test_a_cancelled_wait_between_attempts_frees_the_object_at_once() -> None:
    backend = Watched(MemoryBackend())
    shared = TaskLockService(backend).lock("waiting", ttl=30, wait=6 * PATIENCE)
    assert backend.inner.acquire("waiting", new_token(), ttl=LONG, max_lifetime=LIFE)

    async def main() -> None:
        task = asyncio.create_task(shared.aacquire())
        await asyncio.to_thread(backend.wait_for, lambda: backend.calls(call="peek"))
        # The peek is noted as it is asked: its attempt may still run in its thread
        # (a cancellation then keeps the object until it ends, as the case above
        # shows). Cancel once the task sleeps between two attempts.
        end = time.monotonic() + PATIENCE
        while not sleeping(task):
            assert time.monotonic() < end, "the waiter never slept between attempts"
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        backend.inner.force_release("waiting")
        assert await shared.atry_acquire()
        await shared.arelease()

    asyncio.run(main())
    assert backend.list() == []


@pytest.mark.parametrize("then", ["loop goes on", "loop ends"])
def test_an_attempt_that_never_began_frees_the_object(then: str) -> None:
    """Cancelled before the lock's thread came to its attempt: nothing asked, the object free.

    With the loop gone (``asyncio.run`` returning), the attempt never runs at all.
    """
    backend = Watched(MemoryBackend())
    shared = TaskLockService(backend).lock("queued", ttl=30)
    busy, free = threading.Event(), threading.Event()

    def occupy() -> None:  # whatever else runs on that thread (Django's async ORM calls)
        busy.set()
        free.wait(PATIENCE)

    async def main() -> None:
        occupied = asyncio.create_task(sync_to_async(occupy)())
        await asyncio.to_thread(busy.wait, PATIENCE)
        task = asyncio.create_task(shared.aacquire())
        for _ in range(100):  # its attempt, queued behind occupy()
            if aio._background:
                break
            await asyncio.sleep(0)
        assert aio._background
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(RuntimeError, match="being acquired"):
            await shared.atry_acquire()
        if then == "loop ends":
            return  # asyncio.run cancels the attempt's task before its thread is free
        free.set()
        await occupied
        await _settled()
        assert await shared.atry_acquire()
        await shared.arelease()

    try:
        asyncio.run(main())
        if then == "loop ends":
            assert shared.try_acquire()
            shared.release()
    finally:
        free.set()
    assert backend.calls(call="acquire") == ["acquire"]  # the last one's: none by the attempt
    assert backend.list() == []


def test_an_attempt_given_up_frees_the_object_after_its_loop_ended() -> None:
    backend = HeldUp()
    shared = TaskLockService(backend).lock("loop-ended", ttl=30)

    async def main() -> None:
        task = asyncio.create_task(shared.aacquire())
        await asyncio.to_thread(backend.asked.wait, PATIENCE)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())  # returns while the attempt waits for its answer
    with pytest.raises(RuntimeError, match="being acquired"):
        shared.try_acquire()
    backend.answer.set()  # the attempt ends in its thread, with no loop left
    deadline = time.monotonic() + PATIENCE
    while True:  # until the attempt has discarded its grant and freed the object
        try:
            acquired = shared.try_acquire()
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    assert acquired
    shared.release()
    assert backend.list() == []


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_may_acquire_an_object_its_parent_was_acquiring() -> None:
    backend = Watched(MemoryBackend())
    shared = TaskLockService(backend).lock("forked", ttl=30, wait=6 * PATIENCE)
    assert backend.inner.acquire("forked", new_token(), ttl=LONG, max_lifetime=LIFE)
    waiter = Acquirer("A", shared, backend)
    waiter.start()
    try:
        assert backend.wait_for(lambda: backend.calls("A", "peek"))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child, where the parent's thread A does not exist
            try:
                backend.inner.force_release("forked")
                acquired = shared.try_acquire()
                shared.release()
                os.write(write, b"ok" if acquired else b"no")
            except BaseException as exc:
                os.write(write, repr(exc).encode())
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read, "rb") as answer:
            assert answer.read() == b"ok"
        # In the parent, thread A still acquires the object.
        with pytest.raises(RuntimeError, match="being acquired"):
            shared.try_acquire()
    finally:
        backend.inner.force_release("forked")
        waiter.leave.set()
        waiter.join(PATIENCE)
    assert waiter.outcome == "released"
