"""Lease tokens: ``host:pid:secret/<machine>.<start>``, and the holder they name for this process.

The part after the secret (``django_tasklock.processes.mark``) is what
proves, on this machine, that the process is gone once it is; where it cannot
be read (no ``/proc``) a token is ``host:pid:secret``, as before, and its
lease ends by its ttl only. A ``unique_on`` claim's never has it: the process
that enqueued the task is not the one the claim waits for.
"""

from __future__ import annotations

import binascii
import os
import socket

from django_tasklock import forks, processes
from django_tasklock.backends.base import Holder
from django_tasklock.holders import CLAIM_MARK


def new_token(*, claim: bool = False) -> str:
    """An unguessable token that also names this host and process: ``host:pid:secret``,
    followed by ``/<machine>.<start>`` where this process can be proven gone one day.

    The secret is ``secrets.token_urlsafe(18)``'s: 18 bytes of ``os.urandom``
    in 24 URL-safe base64 characters, made without its layers of calls. A
    ``unique_on`` claim's (``claim``) begins with ``CLAIM_MARK``, so that a
    reader of the storage can tell a task waiting in its queue from a lock,
    and carries no proof of this process (it is not the claim's holder).
    """
    secret = binascii.b2a_base64(os.urandom(18), newline=False).translate(_URL_SAFE)
    this_pid()  # a new process (a fork): named again
    prefix = _token_prefix or _name_this_process()
    if claim:
        return prefix + CLAIM_MARK + secret.decode()
    return prefix + secret.decode() + _token_suffix


def this_pid() -> int:
    """``os.getpid()``; in a new process (a fork), this process's name is made again.

    Not only after ``os.fork()``: a fork that runs no Python hook (uWSGI's
    preforking without ``py-call-osafterfork``, a C extension's ``fork()``)
    would otherwise leave a child naming its parent in its tokens, whose lease
    anyone could take over once the parent is gone (see ``forks``).
    """
    pid = forks.this_pid()
    if pid != _pid:
        _forget()
    return pid


def _forget() -> None:
    global _token_prefix, _token_suffix, _holder, _pid
    _token_prefix, _token_suffix, _holder, _pid = "", "", None, os.getpid()


def this_process() -> Holder:
    """The holder this process's tokens name (``Holder.from_token`` of any of them)."""
    this_pid()
    return _holder or _parse_this_process()


_URL_SAFE = bytes.maketrans(b"+/", b"-_")
# Made on first use, and again once the pid changed (see this_pid):
_token_prefix = ""  # "host:pid:"
_token_suffix = ""  # "/<machine>.<start>" (or "")
_holder: Holder | None = None  # parsed from a token of this process
_pid = 0  # the process they were made in


def _name_this_process() -> str:
    global _token_prefix, _token_suffix
    _token_suffix = processes.mark()
    _token_prefix = f"{socket.gethostname()}:{os.getpid()}:"
    return _token_prefix


def _parse_this_process() -> Holder:
    global _holder
    _holder = Holder.from_token(new_token())
    return _holder
