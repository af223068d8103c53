"""Processes for the dead-holder tests (``tests/leases/test_dead_holders.py``), often in a
pid namespace of their own (``unshare --pid --fork --mount-proc``): there no other
process of this machine can prove them gone, nor they another's.

Run as ``python -m tests.support.dead_workers '<json>'``, the JSON naming the
``mode``, the backend's ``recipe`` (a :class:`BackendRecipe` as a dict) and a
``key``; each writes one line of JSON to stdout when it has something to say.

- ``hold``: acquire ``key`` (ttl 15 min), say ``{"acquired": pid}``, sleep until killed;
- ``take``: try ``key`` every 0.1 s until acquired (``{"taken_at": time.time()}``)
  or ``timeout`` seconds have passed (``{"taken_at": null}``);
- ``reuse`` (in a namespace of its own, as root there): a holder ``a`` takes
  ``key`` and is killed; the next process is given ``a``'s pid
  (``/proc/sys/kernel/ns_last_pid``) and takes ``key + "-b"``; then this
  process tries both keys, then reaps. Says what it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from django_tasklock.testing import BackendRecipe

LONG_TTL = 900.0


def say(**what: Any) -> None:
    print(json.dumps(what), flush=True)


def spawn(spec: dict[str, Any], **changes: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.dead_workers", json.dumps({**spec, **changes})],
        stdout=subprocess.PIPE,
        text=True,
    )


def heard(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"process {process.pid} said nothing (exit {process.wait()})")
    answer: dict[str, Any] = json.loads(line)
    return answer


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    mode: str = spec["mode"]
    key: str = spec["key"]
    backend = BackendRecipe(**spec["recipe"]).build()

    from django_tasklock.api.service import TaskLockService
    from django_tasklock.leases.tokens import new_token

    service = TaskLockService(backend)
    if mode == "hold":
        with service.lock(key, ttl=LONG_TTL):
            say(acquired=os.getpid())
            while True:
                time.sleep(1)
    if mode == "take":
        end = time.monotonic() + spec["timeout"]
        while time.monotonic() < end:
            if service.lock(key, ttl=LONG_TTL).try_acquire():
                say(taken_at=time.time())
                return 0
            time.sleep(0.1)
        say(taken_at=None)
        return 0
    if mode == "reuse":
        from datetime import timedelta

        a = spawn(spec, mode="hold")
        pid = heard(a)["acquired"]
        a.kill()
        a.wait()
        # The next pid this namespace gives is a's: nobody else forks here.
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(pid - 1))
        b = spawn(spec, mode="hold", key=key + "-b")
        try:
            assert heard(b)["acquired"] == pid == b.pid
            ttl, cap = timedelta(seconds=LONG_TTL), timedelta(hours=1)
            took_a = backend.acquire(key, new_token(), ttl=ttl, max_lifetime=cap)
            took_b = backend.acquire(key + "-b", new_token(), ttl=ttl, max_lifetime=cap)
            reaped = [held.key for held in backend.reap_dead_holders()]
            say(
                pid=pid,
                took_a=took_a,
                took_b=took_b,
                reaped=reaped,
                b_holds=backend.peek(key + "-b") is not None,
            )
        finally:
            b.kill()
            b.wait()
        return 0
    raise ValueError(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
