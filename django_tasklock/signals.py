"""Signals sent by the lock service.

Each is sent with keyword arguments ``key`` (the caller's key, without the
``task-lock:`` prefix) and ``holder`` (a :class:`~django_tasklock.backends.base.Holder`
naming host and pid; never the secret token). ``lock_lost`` may be sent from
the heartbeat thread, or from its watchdog thread (see ``watchdog``).
"""

from __future__ import annotations

from django.dispatch import Signal

lock_acquired = Signal()
lock_released = Signal()
lock_lost = Signal()
