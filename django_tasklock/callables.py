"""Validating the functions callers pass: callable, and sync or async as the API expects.

``run_exclusive`` calls what it is given: a coroutine function there would
return a coroutine that is never awaited, so it is refused, naming
``arun_exclusive`` instead; ``arun_exclusive`` refuses what it cannot await.
A plain function that *returns* a coroutine is only seen once it has
returned: the coroutine is closed and refused. Every error is a
``TypeError`` naming the parameter.
"""

from __future__ import annotations

import functools
import inspect
from types import FunctionType

from asgiref.sync import iscoroutinefunction


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


def validate_async_callable(name: str, value: object, *, twin: str) -> None:
    """A coroutine function (``async def``), which the async API awaits."""
    validate_callable(name, value)
    if not is_coroutine_function(value):
        raise TypeError(
            f"{name} must be a coroutine function (async def); use {twin}() for {value!r}"
        )


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
