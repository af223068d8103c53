"""A child of a fork that ran no Python hook names itself, not its parent, in its tokens.

``os.register_at_fork`` hooks run only for ``os.fork()``. uWSGI's preforking
(without ``py-call-osafterfork``) and a C extension's ``fork()`` call libc's
``fork()`` directly: before, a child of a parent that had made a token kept
the parent's pid and start time in its own tokens, so once the parent was
gone the child's live lease looked like a dead holder's and was taken over
(two holders). Here the fork is libc's, through ctypes, in a fresh process
with no other thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import ctypes, json, os, sys

    from django_tasklock import processes
    from django_tasklock.backends.base import Holder
    from django_tasklock.leases.tokens import new_token, this_pid, this_process

    parent = Holder.from_token(new_token())  # the parent's name, remembered
    read, write = os.pipe()
    pid = ctypes.CDLL(None, use_errno=True).fork()  # no os.register_at_fork hook runs
    if pid == 0:
        os.close(read)
        token = new_token()
        held = Holder.from_token(token)
        seen = {
            "getpid": os.getpid(),
            "this_pid": this_pid(),
            "token_pid": held.pid,
            "token_started": held.started,
            "process_pid": this_process().pid,
            "own_start": processes._stat(os.getpid())[1],
            "parent_started": parent.started,
            "mark_is_own": processes.mark().endswith("." + str(held.started)),
        }
        os.write(write, json.dumps(seen).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 4096):
        data += chunk
    os.waitpid(pid, 0)
    sys.stdout.write(data.decode())
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="libc fork and /proc: Linux")
def test_a_child_forked_without_python_hooks_names_itself() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    child = seen["getpid"]
    assert seen["this_pid"] == child
    assert seen["token_pid"] == child, "the child's token names its parent"
    assert seen["process_pid"] == child
    assert seen["token_started"] == seen["own_start"], "the child's token has its parent's start"
    assert seen["mark_is_own"]


HOLDER = textwrap.dedent(
    """
    import ctypes, faulthandler, json, os, sys, time

    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_tasklock"], TASKLOCK_BACKEND="memory")
    django.setup()

    from django_tasklock import lock

    with lock("parent's", ttl=60):  # the parent's heartbeat thread runs
        pass
    # A fork by libc keeps whatever lock another thread held at that instant held for good in
    # the child (Python's own hooks would have reset its locks): fork once the heartbeat has
    # let go of the released lease and waits, idle. Forked at once, as the heartbeat was
    # closing the lease, the child hung once in a CI run.
    from django_tasklock.leases import heartbeat

    beat, deadline = heartbeat._heartbeat, time.monotonic() + 30
    while time.monotonic() < deadline and (beat._heap or beat._touched):
        time.sleep(0.05)
    time.sleep(0.5)
    read, write = os.pipe()
    # PyDLL: the GIL stays with this thread across the fork (CDLL would let
    # another thread hold it at that instant, and the child would hang).
    pid = ctypes.PyDLL(None, use_errno=True).fork()  # no os.register_at_fork hook runs
    if pid == 0:
        os.close(read)
        faulthandler.dump_traceback_later(90, exit=True)  # a hang: say where, and end
        with lock("child's", ttl=3, refresh_interval=0.3) as held:
            lease = held._lease
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and lease.answered_at < lease.asked_at + 4:
                time.sleep(0.05)  # until a refresh answered past the first ttl's end
            seen = {"refreshed": lease.answered_at >= lease.asked_at + 4, "lost": held.lost}
        os.write(write, json.dumps(seen).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 4096):
        data += chunk
    os.waitpid(pid, 0)
    sys.stdout.write(data.decode())
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="libc fork: Linux")
def test_a_child_forked_without_python_hooks_keeps_its_own_leases_alive() -> None:
    """The parent's heartbeat thread is not the child's: the child starts its own."""
    done = subprocess.run(
        [sys.executable, "-c", HOLDER], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout, f"the child said nothing (a hang? its stacks): {done.stderr}"
    seen = json.loads(done.stdout)
    assert seen == {"refreshed": True, "lost": False}, "the child's lease was never refreshed"
