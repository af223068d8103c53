"""Reading one duration a caller passes: seconds (int or float) or a timedelta, 1 ms to 24 h.

Every lock option that is a length of time (``ttl``, ``refresh_interval``,
``max_lifetime``, ``wait``, ``min_hold``, ``progress_timeout``, and each of
``TASKLOCK_DEFAULTS``) is read here, so each is refused by the same rules and
with a message naming it (see ``options`` for how they combine).
"""

from __future__ import annotations

import math
import reprlib
from datetime import timedelta

Duration = int | float | timedelta

#: The shortest duration accepted: anything shorter would round to zero
#: somewhere (microseconds in a timedelta, milliseconds in Redis).
MIN_DURATION = timedelta(milliseconds=1)
#: The longest duration accepted. No lease outlives ``max_lifetime`` (at most
#: 24 h), so a longer ttl or interval would mean nothing, and every storage
#: can represent "now + 24 h".
MAX_DURATION = timedelta(hours=24)


def to_timedelta(name: str, value: object) -> timedelta:
    """Seconds (int or float) or a timedelta, from 1 ms to 24 h.

    Bounds are checked before any conversion, so a huge number is a
    ``ValueError`` naming ``name``, never an ``OverflowError``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, not {value!r}")
    shown = str(value) if isinstance(value, timedelta) else reprlib.repr(value)
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{name} must be a number of seconds, got {shown}")
    # Compared before any conversion: int against float is exact in Python and
    # never overflows, where timedelta(seconds=10**400) would.
    if isinstance(value, timedelta):
        positive, short, long = value > timedelta(0), value < MIN_DURATION, value > MAX_DURATION
    else:
        positive = value > 0
        short = value < MIN_DURATION.total_seconds()
        long = value > MAX_DURATION.total_seconds()
    if not positive:
        raise ValueError(f"{name} must be positive, got {shown}")
    if short:
        raise ValueError(f"{name} must be at least 1 ms (shorter rounds to zero), got {shown}")
    if long:
        raise ValueError(f"{name} must be at most 24 hours, got {shown}")
    return value if isinstance(value, timedelta) else timedelta(seconds=value)
