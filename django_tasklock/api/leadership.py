"""One leader among processes: a lease held for as long as the process lives.

N processes (scheduler instances, say) each make a :class:`Leadership` of the
same key; at any moment at most one of them :attr:`~Leadership.is_leader`. The
leader's lease is kept alive by the process's heartbeat. When the leader dies,
its lease runs out after ``ttl`` and a standby takes it at its next look (every
``retry_interval``). A leader that loses its lease while alive (the storage
unreachable for a ttl, a long pause) stops being leader at its local deadline,
which comes before the storage lets a standby in, and becomes a standby itself.
A force release lets a standby in at once: the old leader finds out at its next
:meth:`~Leadership.poll` (one read), so poll right before what only the leader
may do, as the schedulers do.

Nothing here knows a scheduler: ``django_tasklock.contrib.celery`` and
``django_tasklock.contrib.apscheduler`` build on it.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta, timezone
from types import TracebackType

from django_tasklock.backends.base import BaseBackend, lease_id
from django_tasklock.durations import Duration, to_timedelta
from django_tasklock.leases.lease import clock
from django_tasklock.locking.lock import Lock
from django_tasklock.locking.options import MAX_LIFETIME_LIMIT
from django_tasklock.reasons import RELEASED_BY_OPERATOR, TAKEN

logger = logging.getLogger("django_tasklock")

DEFAULT_TTL = timedelta(seconds=30)
DEFAULT_RETRY_INTERVAL = timedelta(seconds=1)


class Leadership:
    """Whether this process leads ``key``: one lease, kept by the heartbeat, taken again when lost.

    Drive it either from a loop you own, calling :meth:`poll` (Celery beat's
    tick does), or with :meth:`start`, a daemon thread that polls every
    ``retry_interval`` until :meth:`stop` (``with Leadership(...)`` does both).

    Args:
        key: the leadership's key (1 to 245 characters), the same in every process.
        ttl: how long the lease lasts unless refreshed (default 30 s): a dead
            leader's standby takes over at most ``ttl + retry_interval`` after it died,
            plus the time its look takes (see docs/scheduler-leader.md).
        refresh_interval: how often the heartbeat extends the lease (default ``ttl / 3``).
        retry_interval: how often a standby looks whether the key is free (default 1 s;
            one read while it is held).
        backend: the storage (default: ``TASKLOCK_BACKEND``).

    One leader at a time: a leadership takes no ``limit`` (a ``TypeError``, as
    any unknown keyword), since N leaders would be no leadership.

    A term lasts at most 24 hours (the longest ``max_lifetime``): shortly
    before, the leader lets go and takes the key again at once, keeping
    :attr:`leader_since`, unless a standby was quicker.

    Raises:
        TypeError, ValueError: bad arguments, naming the parameter; nothing is written.
    """

    def __init__(
        self,
        key: str,
        *,
        ttl: Duration = DEFAULT_TTL,
        refresh_interval: Duration | None = None,
        retry_interval: Duration = DEFAULT_RETRY_INTERVAL,
        backend: BaseBackend | None = None,
    ) -> None:
        self._lock = Lock(
            key,
            backend=backend,
            ttl=ttl,
            refresh_interval=refresh_interval,
            max_lifetime=MAX_LIFETIME_LIMIT,
        )
        self.retry_interval = to_timedelta("retry_interval", retry_interval)
        self._since: datetime | None = None
        self._term_began = 0.0  # clock() when this term's lease was asked for
        self._unreachable = False  # the last look failed (its warning was logged)
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def __repr__(self) -> str:
        return f"<Leadership {self.key!r} {'leader' if self.is_leader else 'standby'}>"

    @property
    def key(self) -> str:
        return self._lock.key

    @property
    def ttl(self) -> timedelta:
        return self._lock.options.ttl

    @property
    def is_leader(self) -> bool:
        """True while this process holds the lease and its local deadline has not passed.

        No storage call, so it does not see a force release until the next
        :meth:`poll` or heartbeat refresh; :meth:`poll` (one read) does.
        """
        return self._lock.held and not self._lock.lost

    @property
    def leader_since(self) -> datetime | None:
        """When this term began (aware UTC, read after the storage granted it), else None.

        Whatever the previous leader did, it did before this instant: work
        scheduled for earlier was the previous leader's to do (see the schedulers).
        """
        return self._since if self.is_leader else None

    def poll(self) -> bool:
        """Look once: keep, renew or take the leadership if possible; return :attr:`is_leader`.

        Either way one read of the key: a leader checks that its lease is still
        there (a force release lets a standby in at once, before the
        heartbeat's next refresh would notice); a standby tries to take the
        key only when it is free. A storage error is logged, never raised: a
        standby stays one and looks again at the next poll; a leader stays
        leader until its local deadline, as its lease does.
        """
        with self._mutex:
            renewing = False
            if self._lock.held:
                if not self._lock.lost:
                    if clock() >= self._renew_at():
                        renewing = True  # the 24 h cap is near: let go and take it again
                    elif self._still_ours():
                        return True
                if not renewing:
                    logger.warning("Leadership %r lost; now a standby.", self.key)
                self._lock.release()
                if not renewing:
                    self._since = None
            return self._campaign(renewing)

    def _still_ours(self) -> bool:
        """One read: is the lease at the key still this term's? Declares the loss if not.

        A force release lets a standby in at once, long before the heartbeat's
        next refresh would tell this process. Unreachable storage proves
        nothing: the local deadline still holds, and ends the term in time.
        """
        lease = self._lock._lease
        assert lease is not None  # held
        try:
            seen = self._lock.backend.peek(self.key)
        except Exception:
            return True
        if seen is not None and seen.lease in ("", lease_id(lease.token)):
            return True  # ours ("": a backend that does not name leases cannot tell)
        lease.declare(TAKEN if seen is not None else RELEASED_BY_OPERATOR)
        return False

    def _renew_at(self) -> float:
        options = self._lock.options
        return self._term_began + (options.max_lifetime - options.ttl).total_seconds()

    def _campaign(self, renewing: bool) -> bool:
        asked_at = clock()
        try:
            held = not renewing and self._lock.backend.peek(self.key) is not None
            acquired = not held and self._lock.try_acquire()
        except Exception:
            # Once per outage: a standby looks every retry_interval (1 s by default).
            logger.log(
                logging.DEBUG if self._unreachable else logging.WARNING,
                "Leadership %r: the storage could not be reached; still a standby.",
                self.key,
                exc_info=True,
            )
            self._unreachable = True
            self._since = None
            return False
        if self._unreachable:
            self._unreachable = False
            logger.info("Leadership %r: the storage answers again.", self.key)
        if not acquired:
            self._since = None
            return False
        self._term_began = asked_at
        if not renewing or self._since is None:
            self._since = datetime.now(timezone.utc)
            logger.info("Leadership %r taken: this process leads from now on.", self.key)
        return True

    def start(self) -> Leadership:
        """Poll in a daemon thread every ``retry_interval`` until :meth:`stop` (once only)."""
        with self._mutex:
            if self._thread is None or not self._thread.is_alive():
                self._stopping.clear()
                self._thread = threading.Thread(
                    target=self._run, name=f"django-tasklock-leadership {self.key}", daemon=True
                )
                self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self.poll()
                self._stopping.wait(self.retry_interval.total_seconds())
        finally:
            self._lock.backend.close()  # this thread's connections

    def stop(self) -> None:
        """Stop polling and let go of the lease (a standby takes over at its next look)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._mutex:
            self._since = None
            if self._lock.held:
                self._lock.release()

    def __enter__(self) -> Leadership:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
