"""Lease tokens: ``host:pid:secret``, and the holder they name for this process."""

from __future__ import annotations

import binascii
import os
import socket

from django_tasklock.backends.base import Holder


def new_token() -> str:
    """An unguessable token that also names this host and process: ``host:pid:secret``.

    The secret is ``secrets.token_urlsafe(18)``'s: 18 bytes of ``os.urandom``
    in 24 URL-safe base64 characters, made without its layers of calls.
    """
    secret = binascii.b2a_base64(os.urandom(18), newline=False).translate(_URL_SAFE)
    return (_token_prefix or _name_this_process()) + secret.decode()


def this_pid() -> int:
    """``os.getpid()``, remembered (a system call each time) and forgotten in a forked child."""
    return _pid or _remember_pid()


def this_process() -> Holder:
    """The holder this process's tokens name (``Holder.from_token`` of any of them)."""
    return _holder or _parse_this_process()


_URL_SAFE = bytes.maketrans(b"+/", b"-_")
_token_prefix = ""  # "host:pid:", made on first use and again in a forked child
_holder: Holder | None = None  # parsed from a token of this process, likewise
_pid = 0  # likewise


def _remember_pid() -> int:
    global _pid
    _pid = os.getpid()
    return _pid


def _name_this_process() -> str:
    global _token_prefix
    _token_prefix = f"{socket.gethostname()}:{os.getpid()}:"
    return _token_prefix


def _parse_this_process() -> Holder:
    global _holder
    _holder = Holder.from_token(new_token())
    return _holder


def _forget_process_name() -> None:
    global _token_prefix, _holder, _pid
    _token_prefix, _holder, _pid = "", None, 0


os.register_at_fork(after_in_child=_forget_process_name)
