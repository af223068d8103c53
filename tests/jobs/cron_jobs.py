"""django-cron jobs run by real ``manage.py runcrons`` processes (frameworks/test_django_cron.py).

A job learns from its process's environment the test's folder of signal
files (``TASKLOCK_TEST_SIGNALS``) and its name there (``TASKLOCK_TEST_JOB``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from django_cron import CronJobBase, Schedule

from tests.jobs import hold


def _signals() -> str:
    return os.environ["TASKLOCK_TEST_SIGNALS"]


class HoldOne(CronJobBase):
    """Holds ``django-cron:tasklock-tests.one`` until the test releases the job."""

    code = "tasklock-tests.one"
    schedule = Schedule(run_every_mins=1)

    def do(self) -> str:
        return hold(os.environ["TASKLOCK_TEST_JOB"], _signals())


class HoldTwo(HoldOne):
    """The same, on another key."""

    code = "tasklock-tests.two"


class ShortLease(HoldOne):
    """The same, with a 4 s lease (``TASKLOCK_OPTIONS``): a killed runner frees it soon."""

    code = "tasklock-tests.short-lease"
    TASKLOCK_OPTIONS = {"ttl": 4, "refresh_interval": 0.5}


class RecordInterval(CronJobBase):
    """Holds its key for 20 ms; appends when it entered and left (host clock) to a file."""

    code = "tasklock-tests.volume"
    schedule = Schedule(run_every_mins=1)

    def do(self) -> str:
        entry = time.time()
        time.sleep(0.02)
        left = time.time()
        with (Path(_signals()) / f"intervals-{os.getpid()}.txt").open("a") as out:
            out.write(f"{entry} {left}\n")
        return "recorded"


def main(times: int, cron_class: str) -> None:
    """``runcrons --force <cron_class>``, ``times`` times in this process (the volume test)."""
    import django
    from django.core.management import call_command

    django.setup()
    for _ in range(times):
        call_command("runcrons", cron_class, "--force")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
