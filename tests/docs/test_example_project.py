"""The example project's ``manage.py setup`` prints commands that run as printed."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_setup_prints_commands_that_run_outside_an_activated_virtualenv(tmp_path: Path) -> None:
    # A copy, so that its SQLite database is not the checkout's.
    shutil.copytree(
        ROOT / "example_project",
        tmp_path / "example_project",
        ignore=shutil.ignore_patterns("*.sqlite3", "__pycache__"),
    )
    # No virtualenv on PATH, none activated: what a new terminal has.
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TASKLOCK_", "VIRTUAL_ENV", "DJANGO_"))
        },
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "example_project/manage.py", "setup"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = [line.strip() for line in done.stdout.splitlines()]
    ticker = next(line for line in lines if line.endswith("manage.py ticker"))
    assert shlex.split(ticker)[:2] == [sys.executable, "example_project/manage.py"]
    ran = subprocess.run(
        [*shlex.split(ticker), "--count", "1", "--work", "0.1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_commands_are_shown_relative_to_the_working_directory_when_shorter(
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(ROOT / "example_project"))
    try:
        from exampleapp.management.commands.setup import manage_py
    finally:
        sys.path.remove(str(ROOT / "example_project"))
    python, manage = Path(sys.executable), ROOT / "example_project" / "manage.py"
    deep = tmp_path / "a" / "b" / "c"  # from here, relative paths are longer
    assert manage_py("ticker", cwd=deep) == f"{python} {manage} ticker"
    assert manage_py("ticker", cwd=manage.parent).endswith(" manage.py ticker")
    assert manage_py("ticker", cwd=ROOT).endswith(" example_project/manage.py ticker")
    if python.is_relative_to(ROOT):  # the README's .venv
        assert manage_py("ticker", cwd=ROOT).startswith(f"{python.relative_to(ROOT)} ")
