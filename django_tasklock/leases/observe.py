"""The hook point for telemetry: what the lock tells an observer, when one is installed.

:data:`observer` is None unless an integration installs one (the ``otel`` extra's
``django_tasklock.contrib.otel``, enabled by ``TASKLOCK_OPENTELEMETRY = True``). The
lock, the heartbeat and the skip report look at it once per step and do nothing
more while it is None, so a project without telemetry pays one attribute read per
step. Nothing here imports a telemetry library.

An observer's methods run on the thread of the step: the caller's for an
acquisition, a release, a skip; the heartbeat's for a tick (also for a release
the heartbeat makes after the caller's transaction ended). They must be quick
and must not raise.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from datetime import timedelta

    from django_tasklock.backends.base import BaseBackend
    from django_tasklock.leases.lease import Lease


class ObservedLock(Protocol):
    """What an observer reads of a lock (a :class:`~django_tasklock.locking.lock.Lock`).

    A protocol, so that this wing, below the lock's, needs nothing of it.
    """

    key: str
    #: What telemetry calls the lock (``name=``; ``@exclusive``: its key template).
    name: str | None
    wait: timedelta
    #: The grant's fencing token, once granted with ``fencing=True``.
    fence: int | None
    #: At most this many holders of the key at once (``limit=``; 1: a mutex).
    limit: int
    #: The lease of the grant, once granted.
    _lease: Lease | None

    @property
    def backend(self) -> BaseBackend: ...


class Acquisition(AbstractContextManager["Acquisition"], Protocol):
    """One ``acquire()``, from the first look at the key to its outcome.

    Entered before the first look (storage calls made inside belong to it) and
    left with the outcome: ``granted()`` says whether the key was taken; an
    exception leaving the block is a storage error (or an interruption).
    """

    def waiting(self) -> None:
        """The key was held and the caller now waits (said once, at the first pause)."""

    def granted(self, acquired: bool) -> bool:
        """The outcome, returned unchanged; the lease is ``lock``'s when True."""


class Observer(Protocol):
    def acquiring(self, lock: ObservedLock, backend: BaseBackend) -> Acquisition:
        """An acquisition starts (see :class:`Acquisition`)."""

    def released(self, lease: Lease) -> None:
        """The release of ``lease`` was sent (or failed): its hold ends."""

    def skipped(self, lock: ObservedLock, outcome: str) -> None:
        """Work did not run because ``lock``'s key was held; ``outcome``: ``"skipped"``,
        ``"rerun"`` (the call marked the key to run once more) or ``"retry"`` (its
        framework retries the task later)."""

    def heartbeat(self, leases: list[Lease]) -> AbstractContextManager[object]:
        """Around one tick's refresh of ``leases`` (all of one backend)."""


#: The installed observer, or None (the default): then no step calls anything.
observer: Observer | None = None


def install(new: Observer | None) -> None:
    """Make ``new`` the observer of every lock from now on (None: no observer)."""
    global observer
    observer = new
