"""Signals sent by the lock service.

Each is sent with keyword arguments ``key`` (the caller's key, without the
``task-lock:`` prefix) and ``holder`` (a :class:`~django_tasklock.backends.base.Holder`
naming host and pid; never the secret token); ``lock_skipped`` adds
``acquired_at`` and ``expires_at``. ``lock_lost`` also carries ``reason``,
one of the strings in ``django_tasklock.reasons``; it is sent from the
releasing thread when the release finds the loss, else from the notifier
thread (see ``notifier``), never from the heartbeat or the deadline watcher
(a release the heartbeat makes, after a rollback, sends it from the notifier
too). ``lock_stalled`` is always sent from the notifier thread.
"""

from __future__ import annotations

from django.dispatch import Signal

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
#: A lease with ``progress_timeout`` whose work stopped calling ``progress()``: no
#: longer refreshed, it will run out. Sent once, from the notifier thread (the
#: heartbeat notices it, and never runs a receiver itself).
lock_stalled = Signal()
#: ``@exclusive``, ``run_exclusive`` or ``arun_exclusive`` did not run its work: the
#: key was held. Sent on the caller's thread with ``key``, ``holder`` (None if the
#: key came free before it could be read), ``acquired_at`` and ``expires_at``
#: (aware UTC datetimes, or None likewise), and ``outcome``: ``"skipped"``;
#: ``"rerun"`` when the call marked the key and its holder runs once more
#: (``on_locked="rerun"``); ``"retry"`` when the task's framework retries it
#: later (``on_locked="retry"``).
lock_skipped = Signal()
