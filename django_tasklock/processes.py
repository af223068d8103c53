"""Whether a lease's holder process is provably gone: Linux's ``/proc``, on its own machine.

A token names its holder's host and pid, and, where this process can read
them, what tells that process apart from every other process there ever was
(:func:`mark`, appended to the token):

- its **machine**: a digest of the boot id (``/proc/sys/kernel/random/boot_id``,
  new at every boot), the pid namespace and the time namespace of the process
  (``/proc/self/ns/pid``, ``/proc/self/ns/time``). Two processes share it only
  when they run on the same boot of the same kernel and see the same pids:
  a second container with the same host name has another pid namespace, and a
  reboot another boot id;
- its **start time**: field 22 of ``/proc/<pid>/stat``, in clock ticks since
  boot. A pid reused by another process has another start time. Clock ticks
  since boot count neither wall-clock changes nor NTP steps.

A holder is *gone* (:func:`holder_gone` is True) when its machine is this
process's and either no process has its pid, or the process with its pid
started at another time, or it has exited and waits for its parent to reap
it (a zombie). Anything else is not proven: another machine or container, a
platform without ``/proc`` (macOS, Windows), a token without these parts (an
older version's, a ``unique_on`` claim's), a process this one may not look at.

The base of the package: the lease layer reads :func:`mark` into its tokens,
the backends ask :func:`holder_gone` before they take a key over, and the
operators' views show it.
"""

from __future__ import annotations

import base64
import hashlib
import os

from django_tasklock.holders import MACHINE_CHARS, Holder

_PROC = "/proc"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def mark() -> str:
    """``/<machine>.<start>`` for this process's tokens; ``""`` where nothing can be proven."""
    if _mark_pid != os.getpid():  # not yet, or a child of a fork that ran no Python hook
        _remember_mark()
    return _mark


def this_machine() -> str | None:
    """This process's machine (:data:`MACHINE_CHARS` characters), or None without ``/proc``."""
    if _mark_pid != os.getpid():
        _remember_mark()
    return _machine


def holder_gone(holder: Holder) -> bool | None:
    """True when ``holder``'s process is provably gone, False when it provably runs.

    None when this process cannot tell: the holder is of another machine (or
    container), its token carries no proof (an older version's, a
    ``unique_on`` claim's, a value the lock did not write), or this machine
    has no ``/proc`` to look at. Only True lets anyone take its lease over.
    """
    pid, started = holder.pid, holder.started
    if holder.claim or holder.machine is None or started is None or pid is None or pid < 1:
        return None
    if holder.machine != this_machine():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True  # no such process
    except PermissionError:
        pass  # another user's process: it exists
    except (OSError, OverflowError):
        return None
    seen = _stat(pid)
    if seen is None:
        # Gone between the two looks, or hidden from this user (hidepid).
        return True if _no_such_process(pid) else None
    state, start = seen
    if start != started:
        return True  # its pid now belongs to another process
    # A zombie has exited: its parent has not reaped it yet.
    return state in ("Z", "X") and not _other_threads(pid)


_mark = ""
_machine: str | None = None
_mark_pid = 0  # the process they were read in (0: not yet); another pid: read again


def _remember_mark() -> None:
    global _mark, _machine, _mark_pid
    pid = os.getpid()
    machine = _read_machine(pid)
    seen = _stat(pid) if machine is not None else None
    _machine = machine if seen is not None else None
    _mark = "" if seen is None else f"/{machine}.{seen[1]}"
    _mark_pid = pid


def _read_machine(pid: int) -> str | None:
    """The digest of the boot id and this process's pid and time namespaces, or None.

    None also when ``/proc`` is not this process's own (mounted from another
    pid namespace: its ``self`` is not this pid), where a pid read there would
    name another process.
    """
    try:
        with open(_BOOT_ID, "rb") as boot:
            boot_id = boot.read().strip()
        namespaces = [os.readlink(f"{_PROC}/self/ns/pid")]
        if os.path.lexists(f"{_PROC}/self/ns/time"):  # Linux 5.6 and later
            namespaces.append(os.readlink(f"{_PROC}/self/ns/time"))
        if os.readlink(f"{_PROC}/self") != str(pid):
            return None
    except (OSError, ValueError):
        return None
    if not boot_id:
        return None
    digest = hashlib.sha256(b"\0".join([boot_id, *(ns.encode() for ns in namespaces)]))
    return base64.urlsafe_b64encode(digest.digest()).decode()[:MACHINE_CHARS]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of ``pid``, or None if unreadable."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # Field 2, the command in parentheses, may hold spaces and parentheses.
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode("ascii"), int(fields[19])
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _no_such_process(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _other_threads(pid: int) -> bool:
    """Whether a process whose first thread exited still runs other threads."""
    try:
        return any(tid != str(pid) for tid in os.listdir(f"{_PROC}/{pid}/task"))
    except OSError:
        return False
