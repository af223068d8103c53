"""``manage.py setup``: migrate and create the admin user admin / admin, to click around."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

USERNAME = PASSWORD = "admin"
MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"


def manage_py(subcommand: str, cwd: Path | None = None) -> str:
    """The command line running ``manage.py subcommand`` with this very interpreter.

    ``sys.executable``, not ``python``: a new terminal has no virtualenv
    activated, and its ``python`` (if any) lacks Django. Paths are shown
    relative to ``cwd`` (the current directory) when that is shorter.
    """
    here = cwd if cwd is not None else Path.cwd()
    parts = [_shortest(Path(sys.executable), here), _shortest(MANAGE_PY, here), subcommand]
    return shlex.join(parts)


def _shortest(path: Path, cwd: Path) -> str:
    try:
        relative = os.path.relpath(path, cwd)
    except ValueError:  # another drive, on Windows
        return str(path)
    return min(str(path), relative, key=len)


class Command(BaseCommand):
    help = "Migrate the example project's database and create the superuser admin / admin."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0, interactive=False)
        self.stdout.write(f"Database: {settings.DATABASES['default']['NAME']} (migrated)")
        users = get_user_model().objects
        if not users.filter(username=USERNAME).exists():
            users.create_superuser(USERNAME, email="", password=PASSWORD)
        self.stdout.write(
            self.style.SUCCESS(f"Superuser: {USERNAME} / {PASSWORD}")
            + "\n\nNow, in two terminals:\n"
            f"  {manage_py('runserver')}\n"
            f"  {manage_py('ticker')}\n"
            "and open http://127.0.0.1:8000/admin/django_tasklock/cacheentry/ "
            "(and http://127.0.0.1:8000/slow/ to hold a lock from a request)."
        )
