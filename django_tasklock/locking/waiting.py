"""How long a waiter sleeps between two looks at a held key.

Jittered exponential backoff against a monotonic deadline: waiters spread out
instead of polling in step, and none sleeps past the moment the holder's
lease ends (plus a little jitter) or past its own deadline. Not FIFO: whoever
looks first after the key comes free takes it.

A waiter whose storage will tell it of a release (``told``: its watch was
ready before it looked, see ``backends.listening``) is woken by the release
and may sleep up to :data:`MAX_PAUSE`: the pause is only the net under a
lost wake-up. Otherwise (MariaDB, SQLite across processes, a storage behind
PgBouncer's transaction pooling, a listener not yet subscribed) the pause
never exceeds :data:`POLL_PAUSE`, so that a release is noticed within about
40 ms on average, at ten cheap looks a second per waiter.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

#: The first pause, doubled after every look up to the cap.
FIRST_PAUSE = 0.025
#: No pause is longer while a release wakes the waiter.
MAX_PAUSE = 1.0
#: No pause is longer while nothing would wake it, so a key released early is
#: noticed within about this.
POLL_PAUSE = 0.1
#: Added to the holder's time left, so waiters do not all arrive at its expiry at once.
EXPIRY_JITTER = 0.05


class Backoff:
    """The pauses of one waiter, from now until ``wait`` has passed."""

    def __init__(self, wait: timedelta) -> None:
        self.deadline = time.monotonic() + wait.total_seconds()
        self._pause = FIRST_PAUSE

    def next_pause(self, seconds_left: float | None, *, told: bool = False) -> float | None:
        """Seconds to sleep before the next look, or None when the deadline has passed.

        ``seconds_left``: how long the holder's lease has left, when known.
        ``told``: a release of the key after the last look wakes this waiter.
        """
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return None
        longest = self._pause if told else min(self._pause, POLL_PAUSE)
        pause = random.uniform(longest / 2, longest)
        self._pause = min(self._pause * 2, MAX_PAUSE)
        if seconds_left is not None:
            pause = min(pause, seconds_left + random.uniform(0, EXPIRY_JITTER))
        return max(0.001, min(pause, remaining))
