"""``manage.py hold_lock KEY SIGNALS``: hold KEY (ttl 15 min) until stopped, as a job would.

Writes ``SIGNALS/holding`` (its pid) once it holds the key and ``SIGNALS/finally``
when its ``finally`` runs. ``--release-on-sigterm``: calls
``django_tasklock.release_on_sigterm()`` first.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_tasklock import lock, release_on_sigterm
from tests.jobs import PATIENCE


class Command(BaseCommand):
    help = "Hold a task lock until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key")
        parser.add_argument("signals")
        parser.add_argument("--release-on-sigterm", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["release_on_sigterm"]:
            assert release_on_sigterm()
        folder = Path(options["signals"])
        try:
            with lock(options["key"], ttl=900):
                (folder / "holding").write_text(str(os.getpid()))
                time.sleep(PATIENCE)
        finally:
            (folder / "finally").write_text("ran")
