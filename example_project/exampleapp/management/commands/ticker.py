"""``manage.py ticker``: a periodic job, as cron or Celery beat would run it on every node.

Every few seconds it tries to rebuild the rollups under their lock; run it in
two terminals and only one rebuilds at a time. Meanwhile the admin's "Task
locks" page (and ``manage.py tasklock list``) shows who holds the lock.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from exampleapp.tasks import ROLLUPS_KEY, rebuild_rollups


def _positive(value: str) -> float:
    number = float(value)
    if not 0 < number <= 3600:
        raise argparse.ArgumentTypeError("must be between 0 and 3600 seconds")
    return number


class Command(BaseCommand):
    help = "Try to rebuild the rollups under their lock every few seconds, until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--every", type=_positive, default=5.0, help="seconds between runs (default 5)"
        )
        parser.add_argument(
            "--work", type=_positive, default=8.0, help="seconds each rebuild takes (default 8)"
        )
        parser.add_argument("--count", type=int, default=0, help="stop after N runs (0: never)")

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(f"Rebuilding {ROLLUPS_KEY!r} every {options['every']} s; Ctrl-C stops.")
        runs = 0
        try:
            while True:
                result = rebuild_rollups(ttl=30, work_seconds=options["work"])
                runs += 1
                if result.acquired:
                    self.stdout.write(f"rebuilt: {result.result} rows")
                if options["count"] and runs >= options["count"]:
                    return
                time.sleep(options["every"])
        except KeyboardInterrupt:
            self.stdout.write("stopped")
