"""``manage.py tasklock list|clearstale|release`` on every backend."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from datetime import datetime, timedelta

import pytest
from django.core.management import ManagementUtility, call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_tasklock.backends.base import BaseBackend, HeldLock, storage_key
from django_tasklock.management.commands.tasklock import Command
from django_tasklock.service import new_token
from django_tasklock.testing import ContractBackend

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

    assert lines[0].split() == ["KEY", "HOST", "PID", "ACQUIRED", "EXPIRES", "LEFT"]
    assert [line.split()[0] for line in lines[1:]] == [f"{key}:a", f"{key}:b"]
    assert lines[2].split()[1:3] == ["worker-7.example", "4242"]
    assert "UTC" in lines[2]
    assert re.search(r"\b[45] min \d\d s$", lines[2])
    assert "task-lock:" not in "\n".join(lines)
    assert "secret-part" not in "\n".join(lines)


def test_list_json_is_stable(active_backend: ContractBackend, key: str) -> None:
    hold(active_backend.backend, key, "worker-7.example:4242:secret-part")

    [row] = json.loads(run("list", "--json", "--prefix", key))

    assert set(row) >= {"key", "host", "pid", "acquired_at", "expires_at", "seconds_left"}
    assert (row["key"], row["host"], row["pid"]) == (key, "worker-7.example", 4242)
    acquired = datetime.fromisoformat(row["acquired_at"])
    expires = datetime.fromisoformat(row["expires_at"])
    assert acquired.utcoffset() == expires.utcoffset() == timedelta(0)
    assert expires - acquired == pytest.approx(LONG, abs=timedelta(seconds=5))
    assert 0 < row["seconds_left"] <= LONG.total_seconds()


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
        from django_tasklock.service import TaskLockService

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
    out = run("release", key)
    assert f"Released {key!r} (was held by worker-7.example:4242)." in out
    assert key in questions[0]
    assert "worker-7.example:4242" in questions[0]
    assert "secret-part" not in questions[0]
    assert active_backend.backend.peek(key) is None


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
    hold(active_backend.backend, key)

    def fail(self: Command, question: str) -> bool:
        raise AssertionError("asked")

    monkeypatch.setattr(Command, "confirm", fail)
    assert "Released" in run("release", key, "--noinput")
    assert active_backend.backend.peek(key) is None


def test_release_is_silent_at_verbosity_0(key: str) -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        from django_tasklock.service import TaskLockService

        hold(TaskLockService().backend, key)
        assert run("release", key, "--noinput", verbosity=0) == ""
        assert TaskLockService().peek(key) is None


def test_release_of_a_key_not_held(active_backend: ContractBackend, key: str) -> None:
    with pytest.raises(CommandError, match=f"{key!r} is not held"):
        run("release", key, "--noinput")


def test_release_that_loses_a_race_with_expiry(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    with override_settings(TASKLOCK_BACKEND="memory"):
        from django_tasklock.service import TaskLockService

        backend = TaskLockService().backend
        hold(backend, key)
        monkeypatch.setattr(backend, "force_release", lambda key: False)
        with pytest.raises(CommandError, match="ended in the meantime"):
            run("release", key, "--noinput")


def test_confirm_reads_yes_from_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["y", "", "YES ", "no"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    assert [Command().confirm("Sure?") for _ in range(4)] == [True, False, True, False]


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
