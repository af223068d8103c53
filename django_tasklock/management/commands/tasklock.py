"""``manage.py tasklock``: list held locks, sweep stale ones, force-release one.

Works the same on every backend: it speaks to storage only through the
backend ``TASKLOCK_BACKEND`` chooses.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any, TextIO, TypeVar

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_tasklock.api.service import TaskLockService
from django_tasklock.backends.base import BaseBackend, HeldLock, permit_key
from django_tasklock.locking.options import validate_key
from django_tasklock.ops import display

T = TypeVar("T")


def _key(value: str) -> str:
    try:
        return validate_key(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _permit(value: str) -> int:
    """A permit's number as ``list`` shows it: 0 or more."""
    if not (value.isascii() and value.isdigit()) or len(value) > 6:
        raise argparse.ArgumentTypeError(f"a permit's number, as list shows it: not {value!r}")
    return int(value)


def _expires_by_itself(backend: BaseBackend) -> bool:
    # Looked up, not imported: the command must work without redis-py installed.
    module = sys.modules.get("django_tasklock.backends.redis")
    return module is not None and isinstance(backend, module.RedisBackend)


#: What ``-v`` does to each subcommand's output: ``list`` prints what it was asked
#: for at every level (its output is its answer; the exit status is not).
VERBOSITY_HELP = {
    "list": "0 and 1 = the locks, 2 and 3 = the locks, and the backend named on stderr",
    "clearstale": "0 = silent, 1 = how many were removed, 2 and 3 = as 1, and the backend named",
    "release": "0 = silent, 1 = who was released, 2 and 3 = as 1, and the backend named",
}
#: The KEY column of ``list`` keeps at most this many characters of a key (``--json``: all).
KEY_WIDTH = 60


def _common_options(parser: argparse.ArgumentParser, verbosity: str) -> None:
    """Django's common options, accepted after the subcommand too (``tasklock clearstale -v 0``).

    Their default is ``SUPPRESS``: an option not given here leaves the value the
    main parser gave it (from before the subcommand, or its default) alone.
    ``verbosity``: what ``-v`` does to this subcommand (:data:`VERBOSITY_HELP`).
    """
    parser.add_argument(
        "-v",
        "--verbosity",
        type=int,
        choices=[0, 1, 2, 3],
        default=argparse.SUPPRESS,
        help=verbosity,
    )
    parser.add_argument("--settings", default=argparse.SUPPRESS, help="settings module to use")
    parser.add_argument(
        "--pythonpath", default=argparse.SUPPRESS, help="a directory to add to the Python path"
    )
    for flag, help_text in (
        ("--traceback", "raise on CommandError exceptions"),
        ("--no-color", "don't colorize the command output"),
        ("--force-color", "force colorization of the command output"),
        ("--skip-checks", "skip system checks"),
    ):
        parser.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=help_text)


class Command(BaseCommand):
    help = "Inspect and operate the task locks of the configured backend (TASKLOCK_BACKEND)."
    #: ``call_command(..., stdin=...)``: where the confirmation is read (default: sys.stdin).
    stealth_options = ("stdin",)
    stdin: TextIO = sys.stdin

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(
            dest="subcommand", required=True, metavar="{list,clearstale,release}"
        )

        listing = subcommands.add_parser("list", help="held (live) locks")
        listing.add_argument(
            "--json", action="store_true", dest="as_json", help="a JSON list, for scripts"
        )
        listing.add_argument(
            "--prefix", default="", help="only keys starting with PREFIX (without task-lock:)"
        )

        clearing = subcommands.add_parser(
            "clearstale", help="delete expired and abandoned lock entries"
        )
        clearing.add_argument("--dry-run", action="store_true", help="count them, delete nothing")

        release = subcommands.add_parser(
            "release",
            help="force-release the lease of KEY the prompt shows (--noinput: whoever holds it)",
        )
        release.add_argument("key", type=_key, metavar="KEY", help="the key, without task-lock:")
        release.add_argument(
            "--permit",
            type=_permit,
            metavar="N",
            help="only permit N of KEY, a key held as permits (list shows their numbers)",
        )
        release.add_argument(
            "--noinput",
            "--no-input",
            action="store_false",
            dest="interactive",
            help="do not ask: release whoever holds KEY now (and say who it was)",
        )
        release.add_argument(
            "--missing-ok",
            action="store_true",
            help="KEY not held (or its lease ended before the release) is no error: exit 0",
        )

        for name, subparser in (("list", listing), ("clearstale", clearing), ("release", release)):
            _common_options(subparser, VERBOSITY_HELP[name])
            # Django 4.2's subparsers don't inherit it: errors would raise, not print usage.
            subparser.called_from_command_line = parser.called_from_command_line

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdin = options.get("stdin") or sys.stdin
        backend = self._call(lambda: TaskLockService().backend)
        verbosity: int = options["verbosity"]
        if verbosity >= 2:
            cls = type(backend)
            self.stderr.write(f"Backend: {cls.__module__}.{cls.__qualname__}")
        if options["subcommand"] == "list":
            self._list(backend, as_json=options["as_json"], prefix=options["prefix"])
        elif options["subcommand"] == "clearstale":
            self._clear_stale(backend, dry_run=options["dry_run"], verbosity=verbosity)
        else:
            self._release(
                backend,
                options["key"],
                permit=options["permit"],
                interactive=options["interactive"],
                verbosity=verbosity,
                missing_ok=options["missing_ok"],
            )

    def confirm(self, question: str) -> bool:
        """Ask ``question`` on the terminal; True for yes.

        Without a terminal (cron, CI, a pipe) nobody can answer: a ``CommandError``
        says to pass ``--noinput``. End of input or Ctrl-C cancels (a
        ``CommandError``, no traceback). Tests replace this method.
        """
        if not self.stdin.isatty():
            raise CommandError(
                "No terminal to confirm the release on: pass --noinput to release "
                "whoever holds the key without asking."
            )
        try:
            self.stdout.write(f"{question} [y/N] ", ending="")
            self.stdout.flush()
            answer = self.stdin.readline()
        except KeyboardInterrupt:
            answer = ""
        if not answer.endswith("\n"):  # end of input or Ctrl-C: leave the prompt's line
            self.stdout.write("")
            raise CommandError("Release cancelled.")
        return answer.strip().lower() in {"y", "yes"}

    # -- subcommands -------------------------------------------------------------

    def _list(self, backend: BaseBackend, *, as_json: bool, prefix: str) -> None:
        """The held locks; with a backend that marks keys, which are marked to run once
        more, and the marked keys nobody holds (among the held, by key)."""
        locks = [lock for lock in self._call(backend.list) if display.key(lock).startswith(prefix)]
        marks = None
        if backend.capabilities.rerun:
            marks = {
                name: marked_at
                for name, marked_at in self._call(backend.rerun_marks).items()
                if name.startswith(prefix)
            }
        if as_json:
            rows = [
                display.as_json(lock, marks)
                if lock is not None
                else display.unheld_as_json(name, (marks or {})[name])
                for name, lock in display.with_unheld(locks, marks, display.key)
            ]
            self.stdout.write(json.dumps(rows, indent=2))
        elif not locks and not marks:
            self.stdout.write("no locks held")
        else:
            self.stdout.write(self._table(locks, marks or {}))

    def _clear_stale(self, backend: BaseBackend, *, dry_run: bool, verbosity: int) -> None:
        count = self._call(lambda: backend.clear_stale(dry_run=dry_run))
        if verbosity < 1:
            return
        entries = "entry" if count == 1 else "entries"
        if dry_run:
            self.stdout.write(f"Would remove {count} stale lock {entries} (dry run).")
        else:
            self.stdout.write(self.style.SUCCESS(f"Removed {count} stale lock {entries}."))
        if _expires_by_itself(backend):
            self.stdout.write(
                "Redis expires leases itself (their TTL), so there is usually nothing to remove."
            )

    def _release(
        self,
        backend: BaseBackend,
        key: str,
        *,
        permit: int | None,
        interactive: bool,
        verbosity: int,
        missing_ok: bool,
    ) -> None:
        """Release the lease the prompt showed, and only it; with --noinput, the holder's now.

        ``permit``: of a key held as permits, that one (``list`` shows their
        numbers); a key held as permits, released without it, is an error
        that names them, and nothing is released. With ``missing_ok`` a key
        (or permit) found free (or a lease shown that ended before the
        release) is no error: "release it if it is held", for scripts.
        """
        name = key if permit is None else permit_key(key, permit)
        what = display.named(key, permit)
        if interactive:
            shown = self._call(lambda: backend.peek(name))
            if shown is None:
                return self._not_held(backend, key, permit, missing_ok, verbosity)
            if not self.confirm(
                f"Force-release {what}, held by {display.lease(shown)}? "
                "Its holder keeps running and will find its lock lost."
            ):
                raise CommandError("Release cancelled.")
            ended = self._call(lambda: backend.force_release(name, lease=shown.lease))
            if ended is None:
                now = self._call(lambda: backend.peek(name))
                if now is None and missing_ok:
                    return self._not_held(backend, key, permit, missing_ok, verbosity)
                raise CommandError(self._not_released(what, shown, now))
        else:
            ended = self._call(lambda: backend.force_release(name))
            if ended is None:
                return self._not_held(backend, key, permit, missing_ok, verbosity)
        if verbosity >= 1:
            released = (
                f"Released {what} (was held by "
                f"{display.holder(ended.holder)}, lease {ended.lease})."
            )
            self.stdout.write(self.style.SUCCESS(released))

    def _not_held(
        self, backend: BaseBackend, key: str, permit: int | None, missing_ok: bool, verbosity: int
    ) -> None:
        """Nothing was held by that name: an error, or with ``--missing-ok`` a line saying so.

        A key held otherwise than asked is an error even with ``--missing-ok``
        (the key is held, and the command was not told which lease): as
        permits, asked without ``--permit``; as a mutex, asked with it. A
        permit not held, of a key that holds others, is "not held" as any
        lease; the error names the permits held.
        """
        what = display.named(key, permit)
        if permit is not None and self._call(lambda: backend.peek(key)) is not None:
            raise CommandError(
                f"{what} is not held: the key is held as a mutex, without permits; "
                "release it without --permit. Nothing was released."
            )
        held = self._permits_held(backend, key)
        if held is not None and permit is None:
            raise CommandError(
                f"{what} is held as permits, {held}: name one with --permit N. "
                "Nothing was released."
            )
        if not missing_ok:
            of_the_key = "" if held is None else f"; of the key, {held}"
            raise CommandError(f"{what} is not held{of_the_key}.")
        if verbosity >= 1:
            self.stdout.write(f"{what} is not held: nothing to release.")

    def _permits_held(self, backend: BaseBackend, key: str) -> str | None:
        """``2 of 3 permits held (number 0, 2)`` of ``key``; None when it holds none."""
        if not backend.capabilities.permits:
            return None  # none to look for (and Redis would list by a scan of every key)
        groups = display.by_key(self._call(backend.list))
        held = next((held for held in groups if held.key == key and held.limited), None)
        if held is None:
            return None
        numbers = ", ".join(str(n) for n in held.permits)
        return f"{display.permits_held(len(held.permits), held.limit)} (number {numbers})"

    def _not_released(self, what: str, shown: HeldLock, now: HeldLock | None) -> str:
        """Why the lease shown was not released: it ended, or the key changed hands."""
        if now is None:
            return (
                f"{what} is not held: the lease shown (of {display.holder(shown.holder)}) "
                "ended in the meantime. Nothing was released."
            )
        return (
            f"{what} changed hands since the prompt: it is held now by "
            f"{display.lease(now)}, not by {display.holder(shown.holder)}. Nothing was released; "
            "run the command again to release the new holder."
        )

    # -- helpers -----------------------------------------------------------------

    def _call(self, operation: Callable[[], T]) -> T:
        """Run a backend operation; a storage that cannot be reached is a CommandError."""
        try:
            return operation()
        except Exception as exc:
            raise CommandError(f"The lock backend failed: {type(exc).__name__}: {exc}") from exc

    def _table(self, locks: list[HeldLock], marks: dict[str, datetime] | None = None) -> str:
        """One line per lease: keys and hosts :func:`~django_tasklock.ops.display.printable`.

        A limited key's permits follow a line of the key and how many permits
        are held, each as ``permit N`` (its number, what ``release --permit``
        takes). That line spans the columns after KEY, and sets none of their widths.
        ``marks`` (the backend's ``rerun_marks()``): a column RERUN, when a key
        listed is marked, says since when; a marked key nobody holds is a line
        of its own, spanning the columns as a limited key's does.
        """
        marks = marks or {}
        header = ["KEY", "HOST", "PID", "ACQUIRED", "EXPIRES", "HELD", "LEFT"]
        fenced = display.has_fences(locks)
        if fenced:
            header.append("FENCE")
        groups = display.by_key(locks)
        rerun = any(held.key in marks for held in groups)
        if rerun:
            header.append("RERUN")
        rows: list[list[str] | tuple[str, str]] = []
        for name, held in display.with_unheld(groups, marks, lambda held: held.key):
            key = display.shortened(display.printable(name), KEY_WIDTH)
            marked_at = marks.get(name)
            if held is None:
                assert marked_at is not None
                rows.append((key, display.not_held(marked_at)))
                continue
            if not held.limited:
                rows += [self._row(key, lock, fenced, rerun, marked_at) for lock in held.locks]
                continue
            held_count = display.permits_held(len(held.permits), held.limit)
            rows.append((key, f"{held_count} (release one with --permit N)"))
            for lock in held.locks:
                number = display.permit(lock)
                label = "  mutex" if number is None else f"  permit {number}"
                rows.append(self._row(label, lock, fenced, rerun, marked_at))
        cells = [header, *(row for row in rows if isinstance(row, list))]
        widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
        return "\n".join(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            if isinstance(row, list)
            else f"{row[0].ljust(widths[0])}  {row[1]}"
            for row in [header, *rows]
        )

    @staticmethod
    def _row(
        label: str,
        lock: HeldLock,
        fenced: bool,
        rerun: bool = False,
        marked_at: datetime | None = None,
    ) -> list[str]:
        row = [
            label,
            display.printable(lock.holder.host),
            (str(lock.holder.pid) if lock.holder.pid is not None else "?")
            + (f" ({display.GONE})" if display.gone(lock) else ""),
            display.when(lock.acquired_at),
            display.when(lock.expires_at),
            display.duration(display.seconds_held(lock)),
            display.duration(lock.seconds_left),
        ]
        if fenced:
            row.append(str(display.fence(lock) or ""))
        if rerun:
            row.append("" if marked_at is None else display.when(marked_at))
        return row
