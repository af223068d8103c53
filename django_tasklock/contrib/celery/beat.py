"""Celery beat schedulers of which only the leader fires: run as many beats as you like.

Every beat process campaigns for one :class:`~django_tasklock.api.leadership.Leadership`
(key ``tasklock_beat_key``, default ``"celery-beat:<app name>"``). The leader
ticks as Celery's scheduler would; a standby fires nothing and looks whether
the key is free every ``tasklock_beat_retry_interval`` seconds.

A new leader first moves every entry's ``last_run_at`` to the instant it took
over: it fires the next run due *after* that instant, never one the previous
leader may already have sent (every run the previous leader sent was due
before its lease ended, so before this one began). Runs due between the
previous leader's death and the takeover (at most ``ttl + retry_interval``,
plus the standby's look itself) are not sent by anyone: that is the failover
window.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery.beat import PersistentScheduler

from django_tasklock.api.leadership import DEFAULT_RETRY_INTERVAL, DEFAULT_TTL, Leadership


class LeaderMixin:
    """Put before a ``celery.beat.Scheduler`` subclass: it ticks only while this process leads.

    Settings (Celery configuration; ``CELERY_TASKLOCK_BEAT_TTL`` and so on with
    Django's ``namespace="CELERY"``):

    - ``tasklock_beat_key``: the leadership's key (default ``"celery-beat:<app.main>"``);
      beats sharing it elect one leader.
    - ``tasklock_beat_ttl``: seconds the leader's lease lasts unless refreshed (default 30).
    - ``tasklock_beat_retry_interval``: seconds between a standby's looks (default 1).
    """

    app: Any
    max_interval: float
    _heap: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        app: Any = kwargs["app"] if "app" in kwargs else args[0]
        conf = app.conf
        ttl, retry = conf.get("tasklock_beat_ttl"), conf.get("tasklock_beat_retry_interval")
        try:
            self.leadership = Leadership(
                conf.get("tasklock_beat_key") or f"celery-beat:{app.main or 'celery'}",
                ttl=DEFAULT_TTL if ttl is None else ttl,
                retry_interval=DEFAULT_RETRY_INTERVAL if retry is None else retry,
            )
        except (TypeError, ValueError) as exc:  # a 0 was taken for "unset" before
            raise type(exc)(f"Celery setting tasklock_beat_*: {exc}") from exc
        self._term: datetime | None = None  # the term the schedule was moved forward for
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass: fire what is due if this process leads; else wait ``retry_interval``.

        A leader sleeps ``ttl / 2`` at most between two passes, each of which
        polls the leadership first (one read of the key).
        """
        self.leadership.poll()
        since = self.leadership.leader_since
        if since is None:
            self._term = None
            self._forget_unsaved()
            return min(self.leadership.retry_interval.total_seconds(), self.max_interval)
        if since != self._term:
            self.move_to_now()
            self._term = since
        interval: float = super().tick(*args, **kwargs)  # type: ignore[misc]
        # Look again within ttl / 2 at most, whatever is due: the poll near the
        # 24 h cap that renews the term must fall in its last ttl.
        return min(interval, self.leadership.ttl.total_seconds() / 2)

    def move_to_now(self) -> None:
        """Count every entry as run now: the next run sent is the first due from now on.

        Called once per term, before the new leader's first tick.
        """
        schedule = self.schedule  # type: ignore[attr-defined]
        dirty = getattr(self, "_dirty", None)  # django-celery-beat: rows to save at sync
        for entry in schedule.values():
            now = entry._default_now()
            entry.last_run_at = now
            model = getattr(entry, "model", None)
            if model is not None:  # django-celery-beat's ModelEntry saves its model's
                model.last_run_at = now
            if isinstance(dirty, set):
                dirty.add(entry.name)
        self._heap = None  # rebuilt from the moved entries at the next tick

    def _forget_unsaved(self) -> None:
        """Drop the rows a past term marked for saving (django-celery-beat's ``_dirty``).

        Their ``last_run_at`` predate the next leader's term; saved later (at
        this beat's close, say) they would overwrite the next leader's rows,
        and its next read of them would fire those runs again.
        """
        dirty = getattr(self, "_dirty", None)
        if isinstance(dirty, set):
            dirty.clear()

    def close(self) -> None:
        """Sync as Celery does (a leader only), then let go of the leadership."""
        if self.leadership.is_leader:
            self.leadership.poll()  # one read: a force release may have ended the term
        if not self.leadership.is_leader or self.leadership.leader_since != self._term:
            self._forget_unsaved()
        try:
            super().close()  # type: ignore[misc]
        finally:
            self.leadership.stop()

    @property
    def info(self) -> str:
        """For beat's banner (printed before the first tick: before any election)."""
        base: str = super().info  # type: ignore[misc]
        ttl = self.leadership.ttl.total_seconds()
        lead = f"tasklock: one active beat, elected by {self.leadership.key!r} (ttl {ttl:g} s)"
        return f"{base}\n{lead}" if base else lead


class LeaderScheduler(LeaderMixin, PersistentScheduler):  # type: ignore[misc]
    """Celery's default scheduler (``PersistentScheduler``) with one active beat.

    ``celery -A proj beat --scheduler django_tasklock.contrib.celery:LeaderScheduler``.
    Each beat keeps its own schedule file, as Celery's does; only the leader's moves.
    """
