"""``manage.py demo``: see django-tasklock keep work to one process at a time.

1. Race: worker processes released at the same instant all try to rebuild the
   rollups; exactly one does, the others skip and say who holds the lock.
2. Crash: a worker holding a lock is killed with SIGKILL; the lock is refused
   while its lease lasts, then taken over without anyone cleaning up.

Exits non-zero if either does not behave so. ``--worker`` is internal: it is
how the demo starts its worker processes.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from exampleapp.demo.backend import ready_backend
from exampleapp.demo.console import Console
from exampleapp.demo.race import race_worker, run_race
from exampleapp.demo.reclaim import KEY as RECLAIM_KEY
from exampleapp.demo.reclaim import hold_worker, run_reclaim
from exampleapp.tasks import ROLLUPS_KEY


def _count(value: str) -> int:
    number = int(value)
    if not 2 <= number <= 32:
        raise argparse.ArgumentTypeError("must be between 2 and 32")
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if not 1 <= number <= 60:
        raise argparse.ArgumentTypeError("must be between 1 and 60 seconds")
    return number


class Command(BaseCommand):
    help = "Show run_exclusive() across worker processes: a race, then a crashed holder."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workers", type=_count, default=6, help="worker processes in the race (default 6)"
        )
        parser.add_argument(
            "--ttl", type=_seconds, default=3.0, help="lease ttl in seconds (default 3)"
        )
        parser.add_argument("--worker", choices=["race", "hold"], help=argparse.SUPPRESS)
        parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        ttl: float = options["ttl"]
        if options["worker"] == "race":
            sys.exit(race_worker(ttl=ttl, start_at=options["start_at"]))
        if options["worker"] == "hold":
            sys.exit(hold_worker(ttl=ttl))

        console = Console(self.stdout, self.style)
        call_command("migrate", verbosity=0, interactive=False)
        console.say(f"Database: {settings.DATABASES['default']['NAME']} (migrated)")
        ready_backend(console, [ROLLUPS_KEY, RECLAIM_KEY])

        race_ok = run_race(console, workers=options["workers"], ttl=ttl)
        reclaim_ok = run_reclaim(console, ttl=ttl)
        console.heading("Result")
        if not (race_ok and reclaim_ok):
            failed = [name for name, ok in (("race", race_ok), ("crash", reclaim_ok)) if not ok]
            raise CommandError(f"The demo failed ({', '.join(failed)}): see above.")
        console.ok("Both scenarios behaved as django-tasklock promises.")
