"""Job processes that lose their lock and then end (``tests/leases/test_exit_drain.py``).

Run as ``python -m tests.support.exit_workers '<json>'``, the JSON naming the
``mode``, the backend's recipe (a :class:`BackendRecipe` as a dict), a
``key`` and a ``marker`` path. Each holds ``key`` with a short ttl, connects a
``lock_lost`` receiver that takes its time, has the key deleted behind the
heartbeat's back (``force_release``, as ``manage.py tasklock release`` does),
waits until ``lock.lost`` is True, and ends the process the way a job does:

- ``return``: leaves the ``with`` block and returns from main;
- ``exit``: ``raise_if_lost()`` raises ``LockLost`` and the body calls
  ``sys.exit(0)``;
- ``queued``: like ``return``, with a second lock left held: the first
  receiver, run while the process exits, has the second key deleted and waits
  for the heartbeat to declare that loss, so that its announcement is queued
  while the exit drains the notifier;
- ``callback``: like ``return``, with a loss callback (``Lease.on_loss``, run
  by the declaring thread before it queues the announcement) that takes its
  time: the process sees ``lost`` and ends before ``lock_lost`` is even queued;
- ``hang``: the receiver never returns;
- ``fork``: the receiver never returns, and the process forks a child that
  returns from main at once, with the exit's bound raised to an hour: the
  child must not wait for its parent's queue. The marker gets the child's
  exit status, or ``"still running"``.

The receiver writes the marker (the loss's reason) when it is done, or
``"started"`` when it starts, for the receivers that never end.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django_tasklock.testing import BackendRecipe

#: How long the receivers that finish take: long enough to be cut short by an exit.
RECEIVER_TAKES = 0.5
TTL = 5.0
REFRESH_INTERVAL = 0.1


def _wait(condition: Any, what: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            print(f"gave up waiting for {what}", file=sys.stderr)
            sys.exit(3)
        time.sleep(0.01)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    mode: str = spec["mode"]
    key: str = spec["key"]
    marker = Path(spec["marker"])
    backend = BackendRecipe(**spec["recipe"]).build()

    from django_tasklock import LockLost, notifier
    from django_tasklock.api.service import TaskLockService
    from django_tasklock.signals import lock_lost

    service = TaskLockService(backend)
    second = service.lock(f"{key}-second", ttl=TTL, refresh_interval=REFRESH_INTERVAL)
    second_marker = marker.with_name(marker.name + "-second")

    def receiver(sender: object, key: str, reason: str, **kwargs: object) -> None:
        if mode in {"hang", "fork"}:
            marker.write_text("started")
            threading.Event().wait()
        time.sleep(RECEIVER_TAKES)
        if mode == "queued" and key == spec["key"]:
            backend.force_release(second.key)
            if not second.wait_lost(30):
                return
        (second_marker if key == second.key else marker).write_text(reason)

    lock_lost.connect(receiver, weak=False)
    if mode == "queued":
        second.acquire()  # left held: still refreshed while the process exits
    with service.lock(key, ttl=TTL, refresh_interval=REFRESH_INTERVAL) as lock:
        if mode == "callback":
            assert lock._lease is not None
            lock._lease.on_loss(lambda lease: time.sleep(RECEIVER_TAKES))
        backend.force_release(key)
        if mode == "exit":
            try:
                while True:
                    lock.raise_if_lost()
                    time.sleep(0.01)
            except LockLost:
                sys.exit(0)
        _wait(lambda: lock.lost, "the loss")
    if mode == "fork":
        _wait(marker.exists, "the receiver")
        child = os.fork()
        if child == 0:
            notifier.DRAIN_TIMEOUT = 3600.0
            return 0
        end = time.monotonic() + 30  # the test waits 60 s for this process
        while time.monotonic() < end:
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid:
                marker.write_text(f"child exited {os.waitstatus_to_exitcode(status)}")
                break
            time.sleep(0.05)
        else:
            marker.write_text("still running")
            os.kill(child, 9)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
