"""Huey: a drop-in for ``lock_task`` whose lock is a lease.

``from django_tasklock.contrib.huey import lock_task`` in place of
``huey.contrib.djhuey``'s (or ``huey.lock_task``): the same call, as a
decorator or a context manager, and the same answer when the lock is held —
Huey's own ``TaskLockedException``, so a task's ``retries=`` retry it and
``SIGNAL_LOCKED`` is sent. The lock is django-tasklock's: a lease kept alive
by the heartbeat while the task runs, freed by itself when a consumer dies
(no ``run_huey --flush-locks`` needed), listed by ``manage.py tasklock`` and
the admin page. Its key is ``lock_name`` itself. ``install(HUEY)`` gives a
Huey instance's ``lock_task``, ``is_locked`` and ``flush_locks`` the same
(``run_huey --flush-locks`` then ends these leases), and lets
``@exclusive(..., on_locked="retry")`` know the task a consumer runs
(:func:`track_tasks`).
"""

from __future__ import annotations

from django_tasklock.contrib import require

require("huey")

import logging  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable  # noqa: E402
from contextvars import ContextVar  # noqa: E402
from types import TracebackType  # noqa: E402
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast  # noqa: E402

from huey.api import Huey, Task, TaskWrapper  # noqa: E402
from huey.exceptions import RetryTask, TaskLockedException  # noqa: E402

from django_tasklock.api.decorators import ON_LOST, OnLost, exclusive  # noqa: E402
from django_tasklock.api.service import TaskLockService  # noqa: E402
from django_tasklock.api.skipped import report_skipped  # noqa: E402
from django_tasklock.durations import Duration  # noqa: E402
from django_tasklock.exceptions import LockNotAcquired  # noqa: E402
from django_tasklock.locking.lock import Lock  # noqa: E402
from django_tasklock.locking.options import check_lock_kwargs, validate_key  # noqa: E402

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from django_tasklock.locking.options import LockKwargs

__all__ = [
    "HeldRetry",
    "HueyLock",
    "TaskLock",
    "TaskLockedException",
    "current_task",
    "install",
    "lock_task",
    "track_tasks",
]

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("django_tasklock")

#: Every ``lock_name`` a :class:`TaskLock` was made with in this process, as
#: Huey keeps its instance's lock keys: what ``flush_locks()`` flushes (see
#: :func:`install`).
_NAMES: set[str] = set()


class LockTaskOptions(TypedDict, total=False):
    """The lock options besides ``ttl`` (see ``django_tasklock.LockKwargs``)."""

    refresh_interval: Duration | None
    max_lifetime: Duration | None
    wait: Duration | None
    min_hold: Duration | None
    fencing: bool
    progress_timeout: Duration | None


def lock_task(
    lock_name: str,
    ttl: Duration | None = None,
    *,
    on_lost: OnLost = "continue",
    service: TaskLockService | None = None,
    **options: Unpack[LockTaskOptions],
) -> TaskLock:
    """Huey's ``lock_task(lock_name, ttl=None)``, with a lease: see :class:`TaskLock`."""
    return TaskLock(lock_name, ttl, on_lost=on_lost, service=service, **options)


class TaskLock:
    """At most one holder of ``lock_name`` at a time; ``TaskLockedException`` for the others.

    As a decorator (below ``@huey.task()`` / ``@db_task()``, as Huey's own)
    it holds the lock while the function runs; as a context manager, for the
    block (``with lock_task("reports") as lock:`` gives a :class:`HueyLock`,
    the :class:`~django_tasklock.Lock` with Huey's ``is_locked()`` and
    ``clear()``: ``lock.lost``, ``lock.fence``). When
    another holder has ``lock_name``, the work does not run: one INFO line and
    ``lock_skipped`` say who holds it, then ``TaskLockedException("unable to
    acquire lock <lock_name>")`` is raised, which Huey's consumer turns into
    ``SIGNAL_LOCKED`` and, while the task has retries left, a retry.

    ``ttl`` is the lease (seconds or timedelta; default ``TASKLOCK_DEFAULTS``'
    or 15 min), extended every ``refresh_interval`` while the work runs, so it
    is how long a dead consumer keeps the lock, not how long work may take.
    The other lock options (``refresh_interval``, ``max_lifetime``, ``wait``,
    ``min_hold``, ``fencing``, ``progress_timeout``) and ``on_lost`` (for the
    decorator) are those of ``@exclusive``; all are checked now, before
    anything is written. Telemetry (``tasklock.name``) calls the decorator's
    lock by ``lock_name``; the context manager's name may be rendered per call
    (``f"rebuild:{day}"``), so it is not reported.

    One object may be shared by threads (a decorator's is): each use takes a
    lock of its own, and ``acquire()`` and ``release()`` pair up per thread.
    """

    def __init__(
        self,
        lock_name: str,
        ttl: Duration | None = None,
        *,
        on_lost: OnLost = "continue",
        service: TaskLockService | None = None,
        **options: Unpack[LockTaskOptions],
    ) -> None:
        try:
            validate_key(lock_name)
        except (TypeError, ValueError) as exc:  # the messages say "key"; Huey's is "lock_name"
            raise type(exc)(f"lock_name{str(exc).removeprefix('key')}") from None
        check_lock_kwargs(options)
        if "cancel_on_loss" in options:
            raise TypeError("lock_task() takes on_lost='raise', not cancel_on_loss")
        if "limit" in options:
            # Huey's is_locked() and clear() name one key, which permits are not.
            raise TypeError("lock_task() takes no limit: use @exclusive(..., limit=N)")
        if not isinstance(on_lost, str) or on_lost not in ON_LOST:
            error = ValueError if isinstance(on_lost, str) else TypeError
            raise error(f"on_lost must be one of {ON_LOST}, not {on_lost!r}")
        self.name = lock_name
        self.options = cast("LockKwargs", dict(options))
        if ttl is not None:
            self.options["ttl"] = ttl
        self.on_lost = on_lost
        self.service = service if service is not None else TaskLockService()
        self.service.lock(self.name, **self.options)  # every option checked now; nothing written
        self._held = threading.local()
        _NAMES.add(lock_name)

    def __repr__(self) -> str:
        return f"<TaskLock {self.name!r}>"

    # -- decorator -------------------------------------------------------------

    def __call__(self, fn: F) -> F:
        if isinstance(fn, TaskWrapper):
            raise TypeError(
                "lock_task() is above a Huey task: put @huey.task() (or @db_task()) above "
                "@lock_task(...), so that the consumer runs the locked function"
            )
        name = self.name

        def key(*args: Any, **kwargs: Any) -> str:
            return name

        def held(*args: Any, **kwargs: Any) -> Any:
            raise TaskLockedException(f"unable to acquire lock {name}")

        # The decorator's name is fixed: telemetry calls the lock by it (tasklock.name).
        options: LockKwargs = {"name": name, **self.options}
        decorate = exclusive(
            key=key, on_locked=held, on_lost=self.on_lost, service=self.service, **options
        )
        return cast("F", decorate(fn))

    # -- context manager and explicit calls ------------------------------------

    def __enter__(self) -> HueyLock:
        self.acquire()
        held: HueyLock = self._stack()[-1]
        return held

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lock = self._stack().pop()
        lock.__exit__(exc_type, exc, tb)

    def acquire(self) -> bool:
        """Take the lock for this thread: True, or ``TaskLockedException`` when held."""
        lock = self._make_lock()
        try:
            lock.__enter__()
        except LockNotAcquired as exc:
            report_skipped(lock, f"lock_task({self.name!r})")
            raise TaskLockedException(f"unable to acquire lock {self.name}") from exc
        self._stack().append(lock)
        return True

    def release(self) -> None:
        """Let go of the lock this thread took last with :meth:`acquire`."""
        stack = self._stack()
        if not stack:
            raise RuntimeError(f"task lock {self.name!r} is not held by this thread")
        self.__exit__(None, None, None)

    def is_locked(self) -> bool:
        """Whether anyone holds ``lock_name`` now (one read of the storage)."""
        return self.service.peek(self.name) is not None

    locked = is_locked

    def clear(self) -> bool:
        """End whoever's lease holds ``lock_name`` now, as Huey's ``clear()`` deletes its key.

        An operator's action (``manage.py tasklock release`` does the same):
        the holder learns it lost the lock. True if there was a lease to end.
        """
        return self.service.backend.force_release(self.name) is not None

    def _make_lock(self) -> HueyLock:
        return HueyLock(self.name, backend=self.service.backend, **self.options)

    def _stack(self) -> list[HueyLock]:
        stack: list[HueyLock] | None = getattr(self._held, "locks", None)
        if stack is None:
            stack = self._held.locks = []
        return stack


class HueyLock(Lock):
    """The value of ``with lock_task(...) as lock``: django-tasklock's
    :class:`~django_tasklock.Lock` (``lock.lost``, ``lock.fence``), with the two
    methods of Huey's own lock object that a ``with`` block may call."""

    def is_locked(self) -> bool:
        """Whether anyone holds the key now (one read of the storage), as Huey's."""
        return self.backend.peek(self.key) is not None

    locked = is_locked

    def clear(self) -> bool:
        """End whoever's lease holds the key now, as Huey's ``clear()`` deletes its
        key: an operator's action; when that is this lock, it is lost.
        True if there was a lease to end."""
        return self.backend.force_release(self.key) is not None


def install(huey: Huey, *, service: TaskLockService | None = None) -> None:
    """Make ``huey.lock_task``, ``huey.is_locked`` and ``huey.flush_locks`` django-tasklock's.

    After ``install(HUEY)``, code that calls the Huey instance's methods
    (``@HUEY.lock_task("reports")``, ``HUEY.is_locked("reports")``) gets the
    leases of :func:`lock_task`, and ``HUEY.flush_locks()`` — what ``run_huey
    --flush-locks`` and ``--extra-locks`` call when a consumer starts — also
    ends the lease of every ``lock_name`` this process has made a
    :func:`lock_task` with, and of every name given, whoever holds it (as
    Huey's deletes its keys): the names of those it ended are in the set it
    returns, with the names of Huey's own locks it flushed. The names are the
    process's, not the instance's: with several Huey instances (queues), a
    flush ends the leases of every queue's names. A name that no lock can
    have (too long, a NUL) is logged and skipped. ``service``: the storage,
    as for :func:`lock_task` (default: ``TASKLOCK_BACKEND``). Installing
    again replaces the service. Install before the modules that decorate
    with ``@huey.lock_task`` are imported: a decorator applied before keeps
    Huey's own lock. It also calls :func:`track_tasks`.
    """
    if not isinstance(huey, Huey):
        raise TypeError(f"huey must be a Huey instance, not {type(huey).__name__}")
    chosen = service if service is not None else TaskLockService()
    original = getattr(huey, "_tasklock_flush_locks", huey.flush_locks)

    def lock_task_(lock_name: str, ttl: Duration | None = None) -> TaskLock:
        return TaskLock(lock_name, ttl, service=chosen)

    def is_locked(lock_name: str) -> bool:
        return chosen.peek(lock_name) is not None

    def flush_locks(*names: str) -> set[str]:
        flushed: set[str] = set(original(*names))
        given = {name.strip() for name in names} - {""}  # run_huey --extra-locks "a,,b"
        for name in sorted(_NAMES | given):
            try:
                validate_key(name)
            except (TypeError, ValueError) as error:
                # No lease can have it (Huey's own deletes a key that is not there).
                logger.warning("flush_locks: %r is no lock name (%s)", name, error)
                continue
            if chosen.backend.force_release(name) is not None:
                flushed.add(name)
        return flushed

    track_tasks(huey)
    huey._tasklock_flush_locks = original
    huey.lock_task = lock_task_
    huey.is_locked = is_locked
    huey.flush_locks = flush_locks


# -- on_locked="retry": the task a consumer runs --------------------------------

#: The pre- and post-execute hooks' name on a Huey instance (:func:`track_tasks`).
HOOK = "django_tasklock"

#: The Huey instance and the task that this consumer thread runs now.
_RUNNING: ContextVar[tuple[Huey, Task] | None] = ContextVar(
    "django_tasklock_huey_task", default=None
)


class HeldRetry(RetryTask):  # type: ignore[misc]  # huey has no types
    """Huey's ``RetryTask``, raised by ``on_locked="retry"`` when the task's key is held."""


def current_task() -> tuple[Huey, Task] | None:
    """The Huey instance and the task that this thread runs now, or None.

    Known for the instances given to :func:`track_tasks` (or :func:`install`) only.
    """
    return _RUNNING.get()


def tries_key(task: Task) -> str:
    """The counter, in the Huey's storage, of a task's tries that found its key held."""
    return f"django-tasklock:tries:{task.id}"


def track_tasks(huey: Huey) -> None:
    """Let ``@exclusive(..., on_locked="retry")`` know the task ``huey``'s consumer runs.

    Registers a pre- and a post-execute hook named ``"django_tasklock"`` on
    the instance (again: replaced): Huey has no "current task" of its own.
    The tries of a task that found its key held are counted in the
    instance's storage (a counter per task id, :func:`tries_key`), since
    ``RetryTask`` leaves ``task.retries`` as it was; the post-execute hook
    deletes the counter when a retried task ends other than by that retry.
    """
    if not isinstance(huey, Huey):
        raise TypeError(f"huey must be a Huey instance, not {type(huey).__name__}")

    def running(task: Task) -> None:
        _RUNNING.set((huey, task))

    def done(task: Task, value: Any, exception: BaseException | None) -> None:
        _RUNNING.set(None)
        # A task retried has an eta (the retry's): only those may have a counter.
        if task.eta is not None and not isinstance(exception, HeldRetry):
            huey.storage.delete_counter(tries_key(task))

    huey.pre_execute(HOOK)(running)
    huey.post_execute(HOOK)(done)
