"""No duplicate enqueues of a ``django.tasks`` task: ``@unique_on("report:{user_id}")``.

Put ``@unique_on(...)`` above ``@task()``. ``enqueue()`` (and ``aenqueue()``)
then take the task's unique key first and raise
:class:`~django_tasklock.exceptions.AlreadyEnqueued` while an identical task
(same key) is queued or running. The key travels with the task (a keyword
argument the wrapper takes back before calling your function); the worker that
runs it keeps the key's lease alive and frees it when the task returns or
raises. A worker that dies, or a task that never runs, frees it when the lease
runs out (``ttl``). See docs/unique-tasks.md.

Django's Tasks framework (``django.tasks``, Django >= 6.0) or its backport
(``django_tasks``) is imported when this module is; without either, importing
it raises :class:`~django_tasklock.contrib.MissingFramework` saying what to
install (no extra of django-tasklock's does: Django 6 needs none).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from django_tasklock.api.unique import claim, run_claimed, unclaim
from django_tasklock.contrib import require
from django_tasklock.durations import Duration, to_timedelta
from django_tasklock.locking.keys import KeyBuilder, KeySpec

require("django_tasks")  # django.tasks (Django >= 6.0), or the django-tasks backport


def _task_class() -> type:
    """``django.tasks``' Task (Django >= 6.0), else the django-tasks backport's."""
    try:
        task_class: type = importlib.import_module("django.tasks.base").Task
    except ImportError:
        task_class = importlib.import_module("django_tasks.base").Task
    return task_class


Task = _task_class()

#: The keyword argument carrying ``[key, token]`` to the worker.
CLAIM = "tasklock_unique"

DEFAULT_TTL = 3600

TaskT = TypeVar("TaskT")


class _Unique:
    """What ``unique_on`` attached to the wrapped function: the key and the ttl."""

    def __init__(self, func: Callable[..., Any], key: KeySpec, ttl: Duration) -> None:
        self.keys = KeyBuilder(func, key)
        self.ttl = to_timedelta("ttl", ttl)

    def key(self, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if getattr(task, "takes_context", False):  # the worker passes the context first
            args = (None, *args)
        return self.keys(args, kwargs)


class UniqueTaskMixin:
    """``enqueue`` / ``aenqueue`` that take the unique key first (see :func:`unique_on`)."""

    func: Callable[..., Any]

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        unique: _Unique = self.func.__tasklock_unique__  # type: ignore[attr-defined]
        key = unique.key(self, args, kwargs)
        token = claim(key, ttl=unique.ttl)
        try:
            return super().enqueue(*args, **kwargs, **{CLAIM: [key, token]})  # type: ignore[misc]
        except BaseException:
            unclaim(key, token)  # never queued: nobody will free it
            raise

    async def aenqueue(self, *args: Any, **kwargs: Any) -> Any:
        return await sync_to_async(self.enqueue)(*args, **kwargs)


@functools.cache
def _unique_class(base: type) -> type:
    return type(f"Unique{base.__name__}", (UniqueTaskMixin, base), {"__slots__": ()})


def unique_on(key: KeySpec, *, ttl: Duration = DEFAULT_TTL) -> Callable[[TaskT], TaskT]:
    """Make a ``django.tasks`` task unique while queued or running: put it above ``@task()``.

    Args:
        key: a ``str.format`` template over the task function's parameters
            (as ``@exclusive``'s key), or a function of its arguments.
        ttl: seconds (or a timedelta) the key stays held without a refresh
            (default 3600): the longest a task may wait in the queue holding
            it, and how long after its worker died the key is freed. While the
            task runs, the worker's heartbeat refreshes it every ``ttl / 3``.

    Raises (when decorating):
        TypeError: not put above ``@task()``.
        TypeError, ValueError: a bad key template or ttl, naming it.
    """

    def decorate(task: TaskT) -> TaskT:
        if not isinstance(task, Task):
            raise TypeError(f"@unique_on goes above @task(): it was given {task!r}, not a Task")
        given: Any = task
        func = given.func
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"@unique_on does not support async task functions ({func!r})")
        unique = _Unique(func, key, ttl)

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            claimed = kwargs.pop(CLAIM, None)
            if claimed is None:  # called directly: no key to hold
                return func(*args, **kwargs)
            key, token = claimed
            _, result = run_claimed(
                key,
                token,
                lambda: func(*args, **kwargs),
                ttl=unique.ttl,
                name=f"{func.__module__}.{func.__qualname__}",
            )
            return result

        run.__tasklock_unique__ = unique  # type: ignore[attr-defined]
        fields = {name: getattr(given, name) for name in given.__dataclass_fields__}
        base: type = type(task)
        unique_task: TaskT = _unique_class(base)(**{**fields, "func": run})
        return unique_task

    return decorate
