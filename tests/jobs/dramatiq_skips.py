"""A middleware of the tests' Dramatiq broker: it records each message Dramatiq skipped.

Not beside the actors: django-dramatiq imports the middleware before it sets
the broker up, and importing the actors declares them.
"""

from __future__ import annotations

import os
from typing import Any

from dramatiq import Broker
from dramatiq.middleware import Middleware

from tests.support import framework_runs


class RecordSkips(Middleware):
    """Writes a ``.skipped`` file (``after_skip_message``); the last argument is the folder."""

    def after_skip_message(self, broker: Broker, message: Any) -> None:
        framework_runs.skipped(message.args[-1], os.getpid())
