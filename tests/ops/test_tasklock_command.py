"""``manage.py tasklock list|clearstale|release`` on every backend."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import ManagementUtility, call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_tasklock.api.service import new_token
from django_tasklock.backends.base import BaseBackend, HeldLock, permit_key, storage_key
from django_tasklock.management.commands.tasklock import KEY_WIDTH, Command
from django_tasklock.ops import display
from django_tasklock.testing import ContractBackend
from tests.conftest import require_service, runs_manage_py_check

LONG = timedelta(minutes=5)
LIFE = timedelta(hours=1)


def run(*args: str, **options: object) -> str:
    out = io.StringIO()
    call_command("tasklock", *args, stdout=out, stderr=out, **options)
    return out.getvalue()


def hold(backend: BaseBackend, key: str, token: str | None = None) -> str:
    token = token or new_token()
    assert backend.acquire(key, token, ttl=LONG, max_lifetime=LIFE)
    return token


# -- list ----------------------------------------------------------------------------


def test_list_shows_key_holder_and_times(active_backend: ContractBackend, key: str) -> None:
    backend = active_backend.backend
    hold(backend, f"{key}:b", "worker-7.example:4242:secret-part")
    hold(backend, f"{key}:a")

    lines = run("list", "--prefix", key).splitlines()

    assert lines[0].split() == ["KEY", "HOST", "PID", "ACQUIRED", "EXPIRES", "HELD", "LEFT"]
    assert [line.split()[0] for line in lines[1:]] == [f"{key}:a", f"{key}:b"]
    assert lines[2].split()[1:3] == ["worker-7.example", "4242"]
    assert "UTC" in lines[2]
    assert re.search(r"\b[45] min \d\d s$", lines[2])
    assert "task-lock:" not in "\n".join(lines)
    assert "secret-part" not in "\n".join(lines)


def test_list_json_is_stable(active_backend: ContractBackend, key: str) -> None:
    hold(active_backend.backend, key, "worker-7.example:4242:secret-part")

    [row] = json.loads(run("list", "--json", "--prefix", key))

    assert set(row) >= {
        "key",
        "host",
        "pid",
        "acquired_at",
        "expires_at",
        "seconds_held",
        "seconds_left",
    }
    assert (row["key"], row["host"], row["pid"]) == (key, "worker-7.example", 4242)
    acquired = datetime.fromisoformat(row["acquired_at"])
    expires = datetime.fromisoformat(row["expires_at"])
    assert acquired.utcoffset() == expires.utcoffset() == timedelta(0)
    assert expires - acquired == pytest.approx(LONG, abs=timedelta(seconds=5))
    assert 0 < row["seconds_left"] <= LONG.total_seconds()


# What a terminal would act on, in a key and in a holder's host: ESC (colours, the
# window title, clearing the screen), BEL, CR and LF (a forged row), TAB, DEL, a C1
# control (CSI), bidi overrides and isolates (they reorder the rest of the row).
ODD_KEY = (
    "\x1b[31mred\x1b[0m\x07\r\nt-forged  worker.example  1  2026-01-01 00:00:00 UTC"
    "\u202eevil\u202c\u2066iso\u2069\x9b2J\x7f\tend"
)
ODD_KEY_SHOWN = (
    r"\x1b[31mred\x1b[0m\x07\r\nt-forged  worker.example  1  2026-01-01 00:00:00 UTC"
    r"\u202eevil\u202c\u2066iso\u2069\x9b2J\x7f\tend"
)
ODD_HOST = "worker\x1b]0;pwned\x07\n\u202ehost"
ODD_HOST_SHOWN = r"worker\x1b]0;pwned\x07\n\u202ehost"
# C0 and C1 controls, DEL, and the Unicode format characters that reorder text.
RAW = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff]")


def test_list_escapes_what_a_terminal_would_interpret(
    active_backend: ContractBackend, key: str
) -> None:
    backend = active_backend.backend
    odd = f"{key}:{ODD_KEY}"
    hold(backend, odd, f"{ODD_HOST}:4242:secret-part")
    hold(backend, f"{key}:plain", "worker-7.example:7:secret-part")

    table = run("list", "--prefix", key)
    [row] = json.loads(run("list", "--json", "--prefix", f"{key}:\x1b"))

    lines = table.rstrip("\n").split("\n")
    assert len(lines) == 3, ascii(table)  # the header and one line per lock
    assert [line for line in lines if RAW.search(line)] == [], ascii(table)
    [odd_row] = [line for line in lines if line.startswith(f"{key}:\\x1b")]
    # Escaped first, then cut to the column (the whole key is in --json).
    assert odd_row.startswith(display.shortened(f"{key}:{ODD_KEY_SHOWN}", KEY_WIDTH) + "  ")
    assert f"  {ODD_HOST_SHOWN}  4242  " in odd_row
    assert [line.split()[0] for line in lines if line.startswith(f"{key}:plain")] == [
        f"{key}:plain"
    ]
    # --json, for scripts, is unchanged: the exact key and host.
    assert (row["key"], row["host"], row["pid"]) == (odd, ODD_HOST, 4242)


def test_release_escapes_the_key_and_the_holder_it_shows(
    active_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = active_backend.backend
    odd = f"{key}:{ODD_KEY}"
    x = hold(backend, odd, f"{ODD_HOST}:4242:secret-x")
    questions: list[str] = []

    def agree(self: Command, question: str) -> bool:
        questions.append(question)
        return True

    monkeypatch.setattr(Command, "confirm", agree)
    released = run("release", odd)
    hold(backend, odd, f"{ODD_HOST}:4243:secret-y")
    released_noinput = run("release", odd, "--noinput")

    def meanwhile(self: Command, question: str) -> bool:
        questions.append(question)
        assert backend.release(odd, x)
        hold(backend, odd, f"{ODD_HOST}:4244:secret-z")
        return True

    x = hold(backend, odd, f"{ODD_HOST}:4245:secret-x")
    monkeypatch.setattr(Command, "confirm", meanwhile)
    with pytest.raises(CommandError) as info:
        run("release", odd)
    changed_hands = str(info.value)

    for shown in [*questions, released, released_noinput, changed_hands]:
        assert RAW.search(shown.removesuffix("\n")) is None, ascii(shown)  # one line
        assert ODD_KEY_SHOWN in shown, ascii(shown)
        assert f"{ODD_HOST_SHOWN}:42" in shown, ascii(shown)
    assert "changed hands" in changed_hands
    assert f"{ODD_HOST_SHOWN}:4244" in changed_hands


def test_list_shows_how_long_each_lock_has_been_held(
    active_backend: ContractBackend, key: str
) -> None:
    # Acquired 10 minutes ago by the storage's clock, 5 minutes left.
    plant = active_backend.plant
    assert plant is not None
    plant(storage_key(key), new_token(), timedelta(minutes=10), timedelta(minutes=5))

    [row] = json.loads(run("list", "--json", "--prefix", key))
    lines = run("list", "--prefix", key).splitlines()

    assert row["seconds_held"] == pytest.approx(600, abs=30)
    assert row["seconds_left"] == pytest.approx(300, abs=30)
    acquired = datetime.fromisoformat(row["acquired_at"])
    expires = datetime.fromisoformat(row["expires_at"])
    # held + left = the lease's whole span, all by the storage's clock
    span = (expires - acquired).total_seconds()
    assert row["seconds_held"] + row["seconds_left"] == pytest.approx(span, abs=0.01)
    assert lines[0].split()[-2:] == ["HELD", "LEFT"]
    assert re.search(r"\b(9|10) min \d\d s  +[45] min \d\d s$", lines[1]), lines[1]


def test_list_when_nothing_is_held(active_backend: ContractBackend, key: str) -> None:
    assert run("list", "--prefix", key).strip() == "no locks held"
    assert json.loads(run("list", "--json", "--prefix", key)) == []


def test_list_prefix_filters_by_the_callers_key(active_backend: ContractBackend, key: str) -> None:
    hold(active_backend.backend, f"{key}:report")
    hold(active_backend.backend, f"{key}:Report")
    rows = json.loads(run("list", "--json", "--prefix", f"{key}:r"))
    assert [row["key"] for row in rows] == [f"{key}:report"]


def test_list_shows_fences_when_the_backend_has_them(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    # No backend records fences yet: a lock carrying one stands in for it.
    @dataclasses.dataclass(frozen=True)
    class FencedLock(HeldLock):
        fence: int = 0

    with override_settings(TASKLOCK_BACKEND="memory"):
        from django_tasklock.api.service import TaskLockService

        backend = TaskLockService().backend
        hold(backend, key)
        [plain] = backend.list()
        fields = {field.name: getattr(plain, field.name) for field in dataclasses.fields(plain)}
        monkeypatch.setattr(backend, "list", lambda: [FencedLock(**fields, fence=17)])
        table = run("list")
        [row] = json.loads(run("list", "--json"))
    assert table.splitlines()[0].split()[-1] == "FENCE"
    assert table.splitlines()[1].split()[-1] == "17"
    assert row["fence"] == 17


# -- marks to run once more (on_locked="rerun") ---------------------------------------

WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


@pytest.fixture
def marking(active_backend: ContractBackend) -> BaseBackend:
    """The active backend, if it can mark a key "run once more"."""
    if not active_backend.backend.capabilities.rerun:
        pytest.skip(f"{active_backend.name} cannot mark keys (capabilities.rerun)")
    return active_backend.backend


def mark(backend: BaseBackend, key: str, *, release: bool = False) -> None:
    """Hold ``key`` and mark it, as a skipped ``on_locked="rerun"`` call does; then
    (``release``) let go, leaving the mark on a key nobody holds."""
    token = hold(backend, key)
    assert backend.mark_rerun(key, "")
    if release:
        assert backend.release(key, token)


def test_list_says_which_held_keys_are_marked(marking: BaseBackend, key: str) -> None:
    mark(marking, f"{key}:a")
    hold(marking, f"{key}:b")

    lines = run("list", "--prefix", key).splitlines()

    assert lines[0].split() == [
        "KEY",
        "HOST",
        "PID",
        "ACQUIRED",
        "EXPIRES",
        "HELD",
        "LEFT",
        "RERUN",
    ]
    assert lines[1].startswith(f"{key}:a ")
    assert re.search(rf"\d s  +{WHEN}$", lines[1]), lines[1]
    assert lines[2].startswith(f"{key}:b ")
    assert re.search(r"\b[45] min \d\d s$", lines[2]), lines[2]  # no mark: empty


def test_list_shows_a_marked_key_nobody_holds(marking: BaseBackend, key: str) -> None:
    hold(marking, f"{key}:a")
    mark(marking, f"{key}:b", release=True)
    hold(marking, f"{key}:c")

    lines = run("list", "--prefix", key).splitlines()

    assert "RERUN" not in lines[0]  # no key held is marked
    assert [line.split()[0] for line in lines[1:]] == [f"{key}:a", f"{key}:b", f"{key}:c"]
    assert re.fullmatch(
        rf"{re.escape(key)}:b +not held; marked to run once more \(since {WHEN}\)", lines[2]
    ), lines[2]
    # The line spans the columns after KEY, as a limited key's: HOST starts after it.
    assert lines[2].index("not held") == lines[0].index("HOST")


def test_list_of_marks_alone_is_no_empty_list(marking: BaseBackend, key: str) -> None:
    mark(marking, f"{key}:gone", release=True)

    lines = run("list", "--prefix", key).splitlines()
    [row] = json.loads(run("list", "--json", "--prefix", key))

    assert lines[0].split()[0] == "KEY"
    assert lines[1].startswith(f"{key}:gone  not held; marked to run once more (since ")
    assert row["key"] == f"{key}:gone"
    # --prefix filters the marks too
    assert run("list", "--prefix", f"{key}:other").strip() == "no locks held"
    assert json.loads(run("list", "--json", "--prefix", f"{key}:other")) == []


def test_list_json_gives_when_each_key_was_marked(marking: BaseBackend, key: str) -> None:
    before = datetime.now(timezone.utc)
    mark(marking, f"{key}:a")
    mark(marking, f"{key}:b", release=True)
    hold(marking, f"{key}:c")

    rows = json.loads(run("list", "--json", "--prefix", key))

    assert [(row["key"], row["held"]) for row in rows] == [
        (f"{key}:a", True),
        (f"{key}:b", False),
        (f"{key}:c", True),
    ]
    held, unheld, plain = rows
    assert set(unheld) == set(held)
    for row in (held, unheld):
        marked_at = datetime.fromisoformat(row["rerun_marked_at"])
        assert marked_at.utcoffset() == timedelta(0)
        assert abs(marked_at - before) < timedelta(seconds=30)
    assert plain["rerun_marked_at"] is None
    assert all(unheld[field] is None for field in display.LEASE_FIELDS)
    assert held["host"] is not None


def test_list_without_the_capability_shows_no_marks(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        from django_tasklock.api.service import TaskLockService

        backend = TaskLockService().backend
        mark(backend, f"{key}:a")
        mark(backend, f"{key}:b", release=True)
        no_rerun = dataclasses.replace(backend.capabilities, rerun=False)
        monkeypatch.setattr(backend, "capabilities", no_rerun)
        monkeypatch.setattr(backend, "rerun_marks", None)  # never asked
        lines = run("list", "--prefix", key).splitlines()
        [row] = json.loads(run("list", "--json", "--prefix", key))
    assert "RERUN" not in lines[0]
    assert len(lines) == 2
    assert "rerun_marked_at" not in row
    assert row["held"] is True


# -- clearstale ----------------------------------------------------------------------


def stale_count(output: str) -> int:
    found = re.search(r"(\d+) stale lock entr", output)
    assert found, output
    return int(found.group(1))


def test_clearstale_removes_only_stale_lock_entries(
    active_backend: ContractBackend, key: str
) -> None:
    plant = active_backend.plant
    stored_keys = active_backend.stored_keys
    assert plant is not None
    assert stored_keys is not None
    live = storage_key(f"{key}:live")
    hold(active_backend.backend, f"{key}:live")
    redis = active_backend.name == "redis"
    if not redis:  # Redis deletes expired keys itself
        plant(
            storage_key(f"{key}:expired"), new_token(), timedelta(minutes=2), -timedelta(minutes=1)
        )
    plant(storage_key(f"{key}:abandoned"), new_token(), timedelta(hours=25), timedelta(hours=1))
    foreign = f"other-cache:{key}"
    if active_backend.put_foreign is not None:
        active_backend.put_foreign(foreign)
    before = stored_keys()

    would = run("clearstale", "--dry-run")
    assert "Would remove" in would
    # Elsewhere in a shared Redis there may be more; here there are these.
    assert stale_count(would) >= 1 if redis else stale_count(would) == 2
    assert stored_keys() == before

    done = run("clearstale")
    assert "Removed" in done
    assert stale_count(done) >= 1 if redis else stale_count(done) == 2
    assert ("Redis expires leases itself" in done) == redis
    left = stored_keys()
    assert live in left
    assert storage_key(f"{key}:abandoned") not in left
    assert storage_key(f"{key}:expired") not in left
    if active_backend.put_foreign is not None:
        assert foreign in left


def test_clearstale_with_nothing_stale_says_zero() -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        assert "Removed 0 stale lock entries." in run("clearstale")


def test_clearstale_is_silent_at_verbosity_0() -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        assert run("clearstale", verbosity=0) == ""


def test_verbosity_2_names_the_backend() -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        assert "Backend: django_tasklock.backends.memory.MemoryBackend" in run(
            "clearstale", verbosity=2
        )


# -- release -------------------------------------------------------------------------


def test_release_asks_first(
    active_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold(active_backend.backend, key, "worker-7.example:4242:secret-part")
    questions: list[str] = []

    def agree(self: Command, question: str) -> bool:
        questions.append(question)
        return True

    monkeypatch.setattr(Command, "confirm", agree)
    shown = active_backend.backend.peek(key)
    assert shown is not None
    out = run("release", key)
    assert f"Released {key!r} (was held by worker-7.example:4242, lease {shown.lease})." in out
    assert key in questions[0]
    assert "worker-7.example:4242" in questions[0]
    assert f"lease {shown.lease}" in questions[0]  # which lease: the one released
    assert "secret-part" not in questions[0]
    assert active_backend.backend.peek(key) is None


def test_release_confirms_the_lease_shown_not_its_successor(
    active_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The prompt names X; X finishes and Y takes the key before the operator says "y".
    backend = active_backend.backend
    x = hold(backend, key, "worker-x.example:1111:secret-x")

    def meanwhile(self: Command, question: str) -> bool:
        assert "worker-x.example:1111" in question
        assert backend.release(key, x)
        hold(backend, key, "worker-y.example:2222:secret-y")
        return True

    monkeypatch.setattr(Command, "confirm", meanwhile)
    with pytest.raises(CommandError) as info:
        run("release", key)
    assert "changed hands" in str(info.value)
    assert "worker-y.example:2222" in str(info.value)
    assert "Nothing was released" in str(info.value)
    now = backend.peek(key)
    assert now is not None
    assert now.holder.host == "worker-y.example"  # Y still holds it


def test_release_of_a_lease_that_ended_at_the_prompt(
    active_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = active_backend.backend
    x = hold(backend, key, "worker-x.example:1111:secret-x")

    def meanwhile(self: Command, question: str) -> bool:
        assert backend.release(key, x)
        return True

    monkeypatch.setattr(Command, "confirm", meanwhile)
    with pytest.raises(CommandError, match="ended in the meantime"):
        run("release", key)


def test_release_declined_keeps_the_lock(
    active_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold(active_backend.backend, key)
    monkeypatch.setattr(Command, "confirm", lambda self, question: False)
    with pytest.raises(CommandError, match="cancelled"):
        run("release", key)
    assert active_backend.backend.peek(key) is not None


def test_release_noinput_does_not_ask(
    active_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: Command, question: str) -> bool:
        raise AssertionError("asked")

    monkeypatch.setattr(Command, "confirm", fail)
    hold(active_backend.backend, key, "worker-7.example:4242:secret-part")
    assert f"Released {key!r} (was held by worker-7.example:4242, lease " in run(
        "release", key, "--noinput"
    )
    assert active_backend.backend.peek(key) is None


def test_release_is_silent_at_verbosity_0(key: str) -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        from django_tasklock.api.service import TaskLockService

        hold(TaskLockService().backend, key)
        assert run("release", key, "--noinput", verbosity=0) == ""
        assert TaskLockService().peek(key) is None


def test_release_of_a_key_not_held(active_backend: ContractBackend, key: str) -> None:
    with pytest.raises(CommandError, match=f"{key!r} is not held"):
        run("release", key, "--noinput")


def test_release_missing_ok_is_no_error_when_nothing_is_held(
    active_backend: ContractBackend, key: str
) -> None:
    """For cron scripts: "release it if it is held"."""
    assert (
        run("release", key, "--noinput", "--missing-ok")
        == f"{key!r} is not held: nothing to release.\n"
    )
    assert run("release", key, "--noinput", "--missing-ok", verbosity=0) == ""
    hold(active_backend.backend, key, "worker-7.example:4242:secret-part")
    assert "Released" in run("release", key, "--noinput", "--missing-ok")
    assert active_backend.backend.peek(key) is None


def test_release_missing_ok_at_the_prompt(
    active_backend: ContractBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = active_backend.backend
    monkeypatch.setattr(Command, "confirm", lambda self, question: True)
    assert "is not held: nothing to release" in run("release", key, "--missing-ok")
    # The lease shown ended before the release: nothing is held, as asked.
    x = hold(backend, key)

    def meanwhile(self: Command, question: str) -> bool:
        assert backend.release(key, x)
        return True

    monkeypatch.setattr(Command, "confirm", meanwhile)
    assert "is not held: nothing to release" in run("release", key, "--missing-ok")
    # The key changed hands: the operator confirmed another lease. Still an error.
    x = hold(backend, key)

    def changed_hands(self: Command, question: str) -> bool:
        assert backend.release(key, x)
        hold(backend, key)
        return True

    monkeypatch.setattr(Command, "confirm", changed_hands)
    with pytest.raises(CommandError, match="changed hands"):
        run("release", key, "--missing-ok")
    assert backend.peek(key) is not None


# -- what -v does, as each subcommand's help says --------------------------------


def _help(subcommand: str) -> str:
    parser = Command().create_parser("manage.py", "tasklock")
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return " ".join(action.choices[subcommand].format_help().split())


def test_each_subcommands_help_says_what_verbosity_0_does(key: str) -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        from django_tasklock.api.service import TaskLockService

        hold(TaskLockService().backend, key)
        # list: its output is its answer, at every level.
        assert "0 and 1 = the locks" in _help("list")
        assert key in run("list", verbosity=0)
        assert "0 = silent" in _help("clearstale")
        assert run("clearstale", verbosity=0) == ""
        assert "0 = silent" in _help("release")
        assert run("release", key, "--noinput", verbosity=0) == ""


def test_list_cuts_long_keys_in_the_table_never_in_json(
    active_backend: ContractBackend, key: str
) -> None:
    long = key + "-" + "x" * (200 - len(key))
    hold(active_backend.backend, long)
    [header, row] = run("list", "--prefix", key).splitlines()
    shown = row.split()[0]
    assert len(shown) == KEY_WIDTH
    assert shown.endswith("…")
    assert long.startswith(shown[:-1])
    assert len(header) < 200
    [listed] = json.loads(run("list", "--json", "--prefix", key))
    assert listed["key"] == long


# -- the prompt, in a process of its own (a terminal, or none) ---------------------

ROOT = Path(__file__).resolve().parents[2]
_SETTINGS = """
SECRET_KEY = "prompt-tests"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_tasklock"]
DATABASES = {{}}
TASKLOCK_BACKEND = "redis"
TASKLOCK_REDIS_URL = {url!r}
"""


@pytest.fixture
def manage(tmp_path: Path) -> tuple[list[str], dict[str, str], BaseBackend]:
    """``manage.py`` in a new process, on the test Redis, and that Redis's backend here."""
    require_service("redis")
    from django_tasklock.backends.redis import RedisBackend

    (tmp_path / "prompt_settings.py").write_text(_SETTINGS.format(url=settings.REDIS_URL))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "prompt_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    env.pop("TASKLOCK_BACKEND", None)
    return [sys.executable, "-m", "django"], env, RedisBackend(url=settings.REDIS_URL)


def test_release_without_a_terminal_names_noinput(
    manage: tuple[list[str], dict[str, str], BaseBackend], key: str
) -> None:
    command, env, backend = manage
    hold(backend, key)
    try:
        done = subprocess.run(
            [*command, "tasklock", "release", key],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert "CommandError" in done.stderr
        assert "--noinput" in done.stderr
        assert backend.peek(key) is not None

        forced = subprocess.run(
            [*command, "tasklock", "release", key, "--noinput"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert forced.returncode == 0, forced.stderr
        assert f"Released {key!r}" in forced.stdout
        assert backend.peek(key) is None
    finally:
        backend.force_release(key)


def test_ctrl_c_at_the_prompt_cancels_quietly(
    manage: tuple[list[str], dict[str, str], BaseBackend], key: str
) -> None:
    import pty

    command, env, backend = manage
    hold(backend, key)
    ours, theirs = pty.openpty()  # a terminal for the prompt to read from
    # Ctrl-C as a shell's foreground job gets it: a run started in the background
    # (a CI runner, `cmd &` without job control) ignores SIGINT, and a child
    # inherits that; exec keeps the default restored here.
    restore = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    proc: subprocess.Popen[str] | None = None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", restore, *command, "tasklock", "release", key],
            env=env,
            stdin=theirs,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        prompt = ""
        while "[y/N]" not in prompt and time.monotonic() < deadline:
            prompt += proc.stdout.read(1)
        assert "[y/N]" in prompt
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err
        assert "Traceback" not in err
        assert "cancelled" in err
        assert backend.peek(key) is not None
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(ours)
        os.close(theirs)
        backend.force_release(key)


def test_confirm_reads_the_answer_from_the_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = io.StringIO()
    for answer, expected in (("y\n", True), ("\n", False), ("YES \n", True), ("no\n", False)):
        command = Command(stdout=out)
        command.stdin = Terminal(answer)
        assert command.confirm("Sure?") is expected
    assert out.getvalue().count("Sure? [y/N] ") == 4


@pytest.mark.parametrize("stdin", ["", "\x03"])
def test_end_of_input_or_ctrl_c_at_the_prompt_cancels(
    stdin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
            if self.getvalue() == "\x03":
                raise KeyboardInterrupt
            return super().readline()

    command = Command(stdout=io.StringIO())
    command.stdin = Terminal(stdin)
    with pytest.raises(CommandError, match="cancelled"):
        command.confirm("Sure?")


def test_confirm_without_a_terminal_names_noinput() -> None:
    command = Command(stdout=io.StringIO())
    command.stdin = io.StringIO("y\n")
    with pytest.raises(CommandError, match="--noinput"):
        command.confirm("Sure?")


# -- Django's common options, before or after the subcommand ----------------------


@pytest.mark.parametrize(
    "args", [("clearstale", "-v", "0"), ("clearstale", "--verbosity=0"), ("-v", "0", "clearstale")]
)
def test_verbosity_before_or_after_the_subcommand(args: tuple[str, ...]) -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        assert run(*args) == ""


@pytest.mark.parametrize("subcommand", [["list"], ["clearstale"], ["release", "k", "--noinput"]])
def test_every_subcommand_takes_the_common_options(key: str, subcommand: list[str]) -> None:
    parser = Command().create_parser("manage.py", "tasklock")
    common = [
        "-v",
        "2",
        "--settings",
        "tests.settings",
        "--pythonpath",
        ".",
        "--traceback",
        "--no-color",
        "--skip-checks",
    ]
    options = vars(parser.parse_args([*subcommand, *common]))
    assert options["verbosity"] == 2
    assert options["settings"] == "tests.settings"
    assert options["pythonpath"] == "."
    assert options["traceback"] is True
    assert options["no_color"] is True
    assert options["skip_checks"] is True
    assert vars(parser.parse_args([*subcommand, "--force-color"]))["force_color"] is True
    # Given before the subcommand, they are not reset by the subcommand's defaults.
    before = vars(parser.parse_args(["-v", "3", "--traceback", *subcommand]))
    assert (before["verbosity"], before["traceback"]) == (3, True)
    assert vars(parser.parse_args(subcommand))["verbosity"] == 1


@runs_manage_py_check
def test_from_the_command_line_verbosity_after_the_subcommand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        ManagementUtility(["manage.py", "tasklock", "clearstale", "-v", "2"]).execute()
    out, err = capsys.readouterr()
    assert "Backend: django_tasklock.backends.memory.MemoryBackend" in err
    assert "Removed 0 stale lock entries." in out


# -- mistakes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "the following arguments are required: {list,clearstale,release}"),
        (("bogus",), "invalid choice: 'bogus'"),
        (("release",), "the following arguments are required: KEY"),
        (("release", ""), "key must not be empty"),
        (("release", "x" * 246), "key must be at most 245 characters"),
        (("list", "--bogus"), "unrecognized arguments: --bogus"),
    ],
)
def test_mistakes_are_command_errors(args: tuple[str, ...], message: str) -> None:
    with override_settings(TASKLOCK_BACKEND="memory"), pytest.raises(CommandError) as info:
        run(*args)
    assert message in str(info.value)


def test_from_the_command_line_a_mistake_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        ManagementUtility(["manage.py", "tasklock", "release", ""]).execute()
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: manage.py tasklock release" in err
    assert "key must not be empty" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args", [("list",), ("clearstale",), ("release", "k", "--noinput")])
def test_unreachable_storage_is_a_command_error(args: tuple[str, ...]) -> None:
    with (
        override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL="redis://127.0.0.1:1/0"),
        pytest.raises(CommandError, match="The lock backend failed: ConnectionError"),
    ):
        run(*args)


def test_misconfiguration_is_a_command_error() -> None:
    with override_settings(TASKLOCK_BACKEND="nosuch"), pytest.raises(CommandError, match="nosuch"):
        run("list")


# -- permits (limit=N): one key, several leases -------------------------------------


@pytest.fixture
def permits(active_backend: ContractBackend) -> BaseBackend:
    """The active backend, if it gives permits."""
    assert active_backend.backend.capabilities.permits  # every backend gives permits
    return active_backend.backend


def take(backend: BaseBackend, key: str, token: str, limit: int = 3) -> str:
    name = backend.acquire_permit(key, token, limit=limit, ttl=LONG, max_lifetime=LIFE)
    assert name is not None
    return name


def two_of_three(backend: BaseBackend, key: str) -> list[str]:
    """Permits 0 and 2 of ``key`` held (limit 3), by ``worker-0`` and ``worker-2``."""
    tokens = [f"worker-{n}.example:100{n}:secret-{n}" for n in range(3)]
    names = [take(backend, key, token) for token in tokens]
    assert names == [permit_key(key, n) for n in range(3)]
    assert backend.release(names[1], tokens[1])
    return tokens


def test_list_shows_a_limited_key_once_with_its_permits(permits: BaseBackend, key: str) -> None:
    hold(permits, f"{key}:a", "worker-7.example:4242:secret-part")
    two_of_three(permits, f"{key}:reports")

    lines = run("list", "--prefix", key).splitlines()

    assert [line.split()[:4] for line in lines[1:]] == [
        [f"{key}:a", "worker-7.example", "4242", lines[1].split()[3]],
        [f"{key}:reports", "2", "of", "3"],
        ["permit", "0", "worker-0.example", "1000"],
        ["permit", "2", "worker-2.example", "1002"],
    ]
    assert "--permit N" in lines[2]
    assert re.search(r"\b[45] min \d\d s$", lines[4])
    # Never the stored name of a permit: its separator, raw or escaped.
    assert "\x1f" not in "\n".join(lines)
    assert "\\x1f" not in "\n".join(lines)
    # The columns line up: the permits' HOST under the mutex's.
    assert lines[1].index("worker-7") == lines[3].index("worker-0") == lines[4].index("worker-2")


def test_list_json_gives_the_callers_key_the_permits_number_and_its_limit(
    permits: BaseBackend, key: str
) -> None:
    hold(permits, f"{key}:a", "worker-7.example:4242:secret-part")
    two_of_three(permits, f"{key}:reports")

    rows = json.loads(run("list", "--json", "--prefix", key))

    assert [(row["key"], row["permit"], row["limit"], row["host"]) for row in rows] == [
        (f"{key}:a", None, None, "worker-7.example"),
        (f"{key}:reports", 0, 3, "worker-0.example"),
        (f"{key}:reports", 2, 3, "worker-2.example"),
    ]


def test_list_prefix_matches_the_callers_key_of_permits(permits: BaseBackend, key: str) -> None:
    two_of_three(permits, f"{key}:reports")
    hold(permits, f"{key}:rollups")

    def listed(prefix: str) -> list[tuple[str, int | None]]:
        return [
            (row["key"], row["permit"])
            for row in json.loads(run("list", "--json", "--prefix", prefix))
        ]

    assert listed(f"{key}:rep") == [(f"{key}:reports", 0), (f"{key}:reports", 2)]
    assert listed(f"{key}:reports") == [(f"{key}:reports", 0), (f"{key}:reports", 2)]
    assert listed(f"{key}:ro") == [(f"{key}:rollups", None)]


def test_release_one_permit_after_the_prompt(
    permits: BaseBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    limited = f"{key}:reports"
    two_of_three(permits, limited)
    shown = permits.peek(permit_key(limited, 2))
    assert shown is not None
    questions: list[str] = []

    def agree(self: Command, question: str) -> bool:
        questions.append(question)
        return True

    monkeypatch.setattr(Command, "confirm", agree)
    out = run("release", limited, "--permit", "2")

    [question] = questions
    assert question.startswith(f"Force-release permit 2 of {limited!r}, held by worker-2.example")
    assert f"lease {shown.lease}" in question
    assert "secret-2" not in question
    assert out == (
        f"Released permit 2 of {limited!r} (was held by worker-2.example:1002, "
        f"lease {shown.lease}).\n"
    )
    assert permits.peek(permit_key(limited, 2)) is None
    assert permits.peek(permit_key(limited, 0)) is not None  # only the one named


def test_release_noinput_of_one_permit(permits: BaseBackend, key: str) -> None:
    two_of_three(permits, key)
    out = run("release", key, "--permit", "0", "--noinput")
    assert out.startswith(f"Released permit 0 of {key!r} (was held by worker-0.example:1000, ")
    assert permits.peek(permit_key(key, 0)) is None
    assert permits.peek(permit_key(key, 2)) is not None


@pytest.mark.parametrize(
    "options", [(), ("--noinput",), ("--missing-ok",), ("--noinput", "--missing-ok")]
)
def test_release_of_a_limited_key_without_permit_names_them_and_releases_nothing(
    permits: BaseBackend, key: str, monkeypatch: pytest.MonkeyPatch, options: tuple[str, ...]
) -> None:
    two_of_three(permits, key)
    monkeypatch.setattr(Command, "confirm", lambda self, question: pytest.fail("asked"))

    with pytest.raises(CommandError) as info:
        run("release", key, *options)

    assert str(info.value) == (
        f"{key!r} is held as permits, 2 of 3 permits held (number 0, 2): "
        "name one with --permit N. Nothing was released."
    )
    assert [held.key for held in permits.list() if held.key.startswith(key)] == [
        permit_key(key, 0),
        permit_key(key, 2),
    ]


def test_release_of_a_permit_not_held(permits: BaseBackend, key: str) -> None:
    two_of_three(permits, key)
    with pytest.raises(CommandError) as info:
        run("release", key, "--permit", "1", "--noinput")
    assert str(info.value) == (
        f"permit 1 of {key!r} is not held; of the key, 2 of 3 permits held (number 0, 2)."
    )
    # "Release it if it is held": it is not.
    assert run("release", key, "--permit", "1", "--missing-ok") == (
        f"permit 1 of {key!r} is not held: nothing to release.\n"
    )
    with pytest.raises(CommandError, match=rf"^permit 0 of '{key}-free' is not held\.$"):
        run("release", f"{key}-free", "--permit", "0", "--noinput")
    assert permits.peek(permit_key(key, 0)) is not None
    assert permits.peek(permit_key(key, 2)) is not None


def test_release_of_a_permit_of_a_mutex(active_backend: ContractBackend, key: str) -> None:
    hold(active_backend.backend, key)
    for options in [("--noinput",), ("--noinput", "--missing-ok"), ()]:
        with pytest.raises(CommandError) as info:
            run("release", key, "--permit", "0", *options)
        assert str(info.value) == (
            f"permit 0 of {key!r} is not held: the key is held as a mutex, without permits; "
            "release it without --permit. Nothing was released."
        )
    assert active_backend.backend.peek(key) is not None


def test_release_of_a_permit_that_changed_hands_at_the_prompt(
    permits: BaseBackend, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = two_of_three(permits, key)

    def meanwhile(self: Command, question: str) -> bool:
        assert "worker-0.example:1000" in question
        assert permits.release(permit_key(key, 0), tokens[0])
        assert take(permits, key, "worker-9.example:1009:secret-9") == permit_key(key, 0)
        return True

    monkeypatch.setattr(Command, "confirm", meanwhile)
    with pytest.raises(CommandError) as info:
        run("release", key, "--permit", "0")
    assert str(info.value).startswith(
        f"permit 0 of {key!r} changed hands since the prompt: it is held now by "
        "worker-9.example:1009 since "
    )
    assert "Nothing was released" in str(info.value)
    now = permits.peek(permit_key(key, 0))
    assert now is not None
    assert now.holder.host == "worker-9.example"


@pytest.mark.parametrize("value", ["-1", "x", "1.0", "٣", "1234567"])
def test_a_permits_number_is_a_number_as_list_shows_it(value: str) -> None:
    with override_settings(TASKLOCK_BACKEND="memory"), pytest.raises(CommandError) as info:
        run("release", "k", "--permit", value)
    assert "a permit's number, as list shows it" in str(info.value)
