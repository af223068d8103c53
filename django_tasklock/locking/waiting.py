"""How long a waiter sleeps between two looks at a held key.

Jittered exponential backoff against a monotonic deadline: waiters spread out
instead of polling in step, and none sleeps past the moment the holder's
lease ends (plus a little jitter) or past its own deadline. Not FIFO: whoever
looks first after the key comes free takes it.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

#: The first pause, doubled after every look up to the cap.
FIRST_PAUSE = 0.025
#: No pause is longer, so a key released early is noticed within about this.
MAX_PAUSE = 1.0
#: Added to the holder's time left, so waiters do not all arrive at its expiry at once.
EXPIRY_JITTER = 0.05


class Backoff:
    """The pauses of one waiter, from now until ``wait`` has passed."""

    def __init__(self, wait: timedelta) -> None:
        self.deadline = time.monotonic() + wait.total_seconds()
        self._pause = FIRST_PAUSE

    def next_pause(self, seconds_left: float | None) -> float | None:
        """Seconds to sleep before the next look, or None when the deadline has passed.

        ``seconds_left``: how long the holder's lease has left, when known.
        """
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return None
        pause = random.uniform(self._pause / 2, self._pause)
        self._pause = min(self._pause * 2, MAX_PAUSE)
        if seconds_left is not None:
            pause = min(pause, seconds_left + random.uniform(0, EXPIRY_JITTER))
        return max(0.001, min(pause, remaining))
