"""Tasks run by real worker processes (Celery, Django's Tasks framework) in the tests.

The worker processes and the test share the lock storage (the test's SQLite
database file) and a directory of signal files through which a task says it
holds its key and the test tells it to finish.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

#: Django >= 6.0 has the Tasks framework built in; before, the django-tasks backport.
BUILTIN_TASKS = importlib.util.find_spec("django.tasks") is not None
HAS_DJANGO_TASKS = BUILTIN_TASKS or importlib.util.find_spec("django_tasks") is not None
HAS_TASKS_DB = importlib.util.find_spec("django_tasks_db") is not None
HAS_CELERY = importlib.util.find_spec("celery") is not None

_tasks_package = "django.tasks" if BUILTIN_TASKS else "django_tasks"
#: Apps the Django Tasks framework needs, when it is installed.
TASK_APPS = [
    *([] if BUILTIN_TASKS or not HAS_DJANGO_TASKS else ["django_tasks"]),
    *(["django_tasks_db"] if HAS_DJANGO_TASKS and HAS_TASKS_DB else []),
]
#: The TASKS setting: the database queue served by ``db_worker``, and the immediate one.
TASKS = {
    "default": {"BACKEND": f"{_tasks_package}.backends.immediate.ImmediateBackend"},
    **(
        {"database": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
        if HAS_DJANGO_TASKS and HAS_TASKS_DB
        else {}
    ),
}

#: How long a task waits for the test at most, so that nothing hangs forever.
PATIENCE = 60.0


def hold(job: str, signals: str) -> str:
    """Announce ``job`` (a ``.holding`` file), await its ``.release`` file, return ``ran:job``."""
    folder = Path(signals)
    (folder / f"{job}.holding").write_text(str(os.getpid()))
    wait_for(folder / f"{job}.release")
    return f"ran:{job}"


def wait_for(path: Path, timeout: float = PATIENCE) -> None:
    """Wait until ``path`` exists; ``TimeoutError`` naming it after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def await_lines(path: Path, count: int, timeout: float = PATIENCE) -> None:
    """Wait until ``path`` has ``count`` lines or more; ``TimeoutError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not path.exists() or len(path.read_text().split()) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not get {count} lines within {timeout} s")
        time.sleep(0.05)


def ran(name: str, signals: str) -> None:
    """Append this process's pid to ``<signals>/<name>.runs`` (one line per run)."""
    with (Path(signals) / f"{name}.runs").open("a") as runs:
        runs.write(f"{os.getpid()}\n")
