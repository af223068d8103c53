"""Signals sent by the lock service.

Each is sent with keyword arguments ``key`` (the caller's key, without the
``task-lock:`` prefix) and ``holder`` (a :class:`~django_tasklock.backends.base.Holder`
naming host and pid; never the secret token). ``lock_lost`` also carries
``reason``, one of the strings in ``django_tasklock.reasons``; it is sent from
the releasing thread when the release finds the loss, else from the notifier
thread (see ``notifier``), never from the heartbeat or the deadline watcher.
"""

from __future__ import annotations

from django.dispatch import Signal

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
