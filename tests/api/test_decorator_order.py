"""``@exclusive`` above a task decorator is refused when decorating, naming the right order.

Below is right: the worker runs the locked function. Above, ``exclusive``
would wrap the task object, and the mistake showed only when the task was
sent (``'function' object has no attribute 'delay'``) or as "func must be
callable, not Task".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_tasklock import exclusive
from tests.jobs import BUILTIN_TASKS
from tests.support import processes

_names = itertools.count()


def job(key: str) -> str:
    """A task body: the frameworks take module-level functions only."""
    return key


def bare_shared_job(key: str) -> str:
    return key


def bound_job(self: Any, key: str) -> str:
    return key


def celery_tasks() -> Iterator[tuple[str, Any]]:
    """(how it was made, a task of ``job``), each under its own name."""
    processes.require_module("celery")
    from celery import Celery, shared_task

    app = Celery("tasklock-order", broker="memory://", set_as_current=False)
    yield "@shared_task", shared_task(bare_shared_job)
    yield "@shared_task()", shared_task(name=f"tasklock-order.{next(_names)}")(job)
    yield "@app.task()", app.task(name=f"tasklock-order.{next(_names)}")(job)
    bound = app.task(bind=True, name=f"tasklock-order.{next(_names)}")
    yield "@app.task(bind=True)", bound(bound_job)


def django_task(func: Callable[..., Any]) -> Any:
    if BUILTIN_TASKS:
        from django.tasks import task
    else:
        processes.require_module("django_tasks")
        from django_tasks import task  # type: ignore[no-redef,unused-ignore]
    return task()(func)


@pytest.mark.parametrize("bare", [False, True], ids=["called", "bare"])
def test_exclusive_above_a_celery_task_names_the_right_order(bare: bool) -> None:
    for made, task in celery_tasks():
        with pytest.raises(TypeError, match=r"put @shared_task \(or @app\.task\) above") as info:
            exclusive(task) if bare else exclusive("job:{key}")(task)
        assert "@exclusive" in str(info.value), made


@pytest.mark.parametrize("bare", [False, True], ids=["called", "bare"])
def test_exclusive_above_a_django_task_names_the_right_order(bare: bool) -> None:
    task = django_task(job)
    with pytest.raises(TypeError, match=r"put @task\(\) above @exclusive"):
        exclusive(task) if bare else exclusive("job:{key}")(task)


def test_the_right_order_still_decorates() -> None:
    processes.require_module("celery")
    from celery import Celery

    app = Celery("tasklock-order", broker="memory://", set_as_current=False)
    locked = exclusive("job:{key}")(job)
    assert hasattr(app.task(name=f"tasklock-order.{next(_names)}")(locked), "delay")
    assert hasattr(django_task(locked), "enqueue")


def test_the_core_imports_no_task_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, django_tasklock\n"
        "django_tasklock.exclusive('k:{a}')(lambda a: a)\n"
        "print(sorted(m for m in ('celery', 'django_tasks', 'django.tasks') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr
