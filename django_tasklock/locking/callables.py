"""Validating the functions callers pass: callable, and sync or async as the API expects.

``run_exclusive`` calls what it is given: a coroutine function there would
return a coroutine that is never awaited, so it is refused, naming
``arun_exclusive`` instead. ``arun_exclusive`` awaits what its callable
returns, so it takes an ``async def`` and a ``lambda: coro()`` alike, and
refuses only a result it cannot await, naming ``run_exclusive``. A plain
function that *returns* a coroutine to the sync API is only seen once it
has returned: the coroutine is closed and refused, naming ``arun_exclusive``
(which takes that very function). Every error is a ``TypeError`` naming the
parameter.
"""

from __future__ import annotations

import functools
import inspect
from types import FunctionType
from typing import TypeVar

from asgiref.sync import iscoroutinefunction

T = TypeVar("T")


def validate_callable(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not callable(value):
        raise TypeError(f"{name} must be callable, not {type(value).__name__}")


def is_coroutine_function(value: object) -> bool:
    """``async def`` functions, also behind ``functools.partial`` or as ``__call__``."""
    if (
        type(value) is FunctionType
        and not value.__code__.co_flags & inspect.CO_COROUTINE
        and not value.__dict__
    ):
        # A plain function, not async def, with no attributes (so no mark of
        # asgiref's or Python's markcoroutinefunction): what the checks below
        # would answer, without their dozen calls on every run_exclusive.
        return False
    while isinstance(value, functools.partial):
        value = value.func
    if iscoroutinefunction(value):  # asgiref's: inspect's, and marked sync_to_async wrappers
        return True
    call = getattr(type(value), "__call__", None)  # noqa: B004 - the class's, not callable()
    return not inspect.isroutine(value) and inspect.iscoroutinefunction(call)


def validate_sync_callable(name: str, value: object, *, twin: str, optional: bool = False) -> None:
    """A callable the sync API may call: a coroutine function would never run."""
    validate_callable(name, value, optional=optional)
    if value is not None and is_coroutine_function(value):
        raise TypeError(
            f"{name} is a coroutine function, which the sync API would never await; "
            f"use {twin}() instead"
        )


def awaited(name: str, value: T, *, twin: str) -> T:
    """What the async API's callable returned, which it awaits: an awaitable.

    An ``async def``, and as well what users naturally pass for one: a
    ``lambda: coro()`` or a ``functools.partial`` of an ``async def``. A plain
    function's plain result (it already ran, on the event loop) is refused,
    naming ``twin``, the sync API that calls plain functions.
    """
    if not inspect.isawaitable(value):
        raise TypeError(
            f"{name} returned {type(value).__name__}, not an awaitable: the async API awaits "
            f"what it calls (an async def, or a callable returning a coroutine); use {twin}() "
            "for a plain function"
        )
    return value


def refuse_coroutine(name: str, value: object, *, advice: str) -> None:
    """Refuse a coroutine a plain function returned to the sync API.

    It would run (if ever) outside the lock, which was held only while the
    coroutine was made. Closed first, so Python does not also warn that it
    was never awaited.
    """
    if inspect.iscoroutine(value):
        value.close()
        raise TypeError(
            f"{name} returned a coroutine, which the sync API does not await: it would "
            f"run outside the lock; {advice}"
        )
