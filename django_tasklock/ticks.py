"""The heartbeat's recent ticks, at the path the health docs name.

The ticks live in :mod:`django_tasklock.leases.ticks` with the heartbeat that
records them; this module keeps the documented ``django_tasklock.ticks`` import
working.
"""

from __future__ import annotations

from django_tasklock.leases.ticks import Tick, last_tick, recent_ticks

__all__ = ["Tick", "last_tick", "recent_ticks"]
