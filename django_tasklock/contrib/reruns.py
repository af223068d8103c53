"""The senders of ``on_locked="rerun"``: each framework's way to send a skipped task call
once more (``api.rerun``).

Installed when the app is ready (:func:`install`), for every framework at
once: each looks for its framework among the modules already imported
(``sys.modules``), never importing one. ``describe`` gives the call of a task
of it running now (name and arguments, as JSON); ``send`` enqueues such a
call, in the holder's process. A framework without a sender here leaves the
holder to run its own work again, in-line.

Celery and RQ name the task running now. django-q2 and Django's Tasks
framework do not: their workers' signals (sent before and after a task runs)
tell it, and ``install()`` connects receivers to them when the framework is
there (see ``_connect_signals``): only then is their ``signals`` module
imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from contextvars import ContextVar
from typing import Any

from django.utils.module_loading import import_string

from django_tasklock.api.rerun import Sender, register_sender
from django_tasklock.contrib import running


def celery_describe() -> dict[str, Any] | None:
    """Celery: the running task's name and arguments (``request.args``, ``request.kwargs``)."""
    task = running.celery_task()
    if task is None:
        return None
    request = task.request
    return {"task": task.name, "args": list(request.args or ()), "kwargs": request.kwargs or {}}


def celery_send(call: dict[str, Any]) -> None:
    """Celery: ``send_task`` by name on the current app (routed as the app routes it)."""
    app: Any = sys.modules["celery"].current_app
    app.send_task(call["task"], args=call["args"], kwargs=call["kwargs"])


# -- Dramatiq -----------------------------------------------------------------

#: The message options a Dramatiq call sent once more keeps: how it is run and
#: retried. Not the ``retries`` count, nor what belongs to the skipped message
#: alone (its ``eta``, a broker's ids, pipelines, groups, ``on_success``...).
DRAMATIQ_OPTIONS = (
    "max_retries",
    "min_backoff",
    "max_backoff",
    "time_limit",
    "max_age",
    "notify_shutdown",
)


def dramatiq_describe() -> dict[str, Any] | None:
    """Dramatiq: the running message's actor, queue, arguments and run options
    (:data:`DRAMATIQ_OPTIONS`); None where no message is known (neither ``TaskLock``
    nor ``CurrentMessage`` on the broker; an ``async def`` actor)."""
    message = running.dramatiq_message()
    if message is None:
        return None
    common: Any = sys.modules["dramatiq.common"]
    options = message.options or {}
    return {
        "task": message.actor_name,
        "queue": common.q_name(message.queue_name),  # not its delay queue's
        "args": list(message.args or ()),
        "kwargs": dict(message.kwargs or {}),
        "options": {name: options[name] for name in DRAMATIQ_OPTIONS if name in options},
    }


def dramatiq_send(call: dict[str, Any]) -> None:
    """Dramatiq: a new message to the actor of that name on the global broker
    (``send_with_options``), on the queue the skipped message came from."""
    broker: Any = getattr(sys.modules.get("dramatiq.broker"), "global_broker", None)
    if broker is None:
        raise RuntimeError("no Dramatiq broker is set in this process (dramatiq.set_broker)")
    actor = broker.get_actor(call["task"])  # ActorNotFound: not declared here
    args, kwargs, options = tuple(call["args"]), call["kwargs"], call.get("options", {})
    queue = call.get("queue") or actor.queue_name
    if queue == actor.queue_name:
        actor.send_with_options(args=args, kwargs=kwargs, **options)
    else:  # sent to another queue than the actor's: back there
        message = actor.message_with_options(args=args, kwargs=kwargs, **options)
        broker.enqueue(message.copy(queue_name=queue))


# -- Huey ---------------------------------------------------------------------


def huey_describe() -> dict[str, Any] | None:
    """Huey: the running task's name in its Huey's registry, its arguments, its Huey's
    name; known where ``contrib.huey.track_tasks`` (or ``install``) hooked the consumer."""
    found = running.huey_task()
    if found is None:
        return None
    instance, task = found
    kwargs = dict(task.kwargs or {})
    if kwargs.get("task") is task:  # a context=True task's own, injected
        del kwargs["task"]
    return {
        "task": instance._registry.task_to_string(type(task)),
        "huey": instance.name,
        "args": list(task.args or ()),
        "kwargs": kwargs,
        "priority": task.priority,
    }


def _huey_instance() -> Any:
    """The Huey to enqueue on: the one whose task runs here (the holder's), else djhuey's."""
    found = running.huey_task()
    if found is not None:
        return found[0]
    djhuey: Any = sys.modules.get("huey.contrib.djhuey")
    if djhuey is not None:
        return djhuey.HUEY
    raise RuntimeError(
        "no Huey instance to send a Huey task with: the holder runs in no tracked Huey task "
        "(contrib.huey.track_tasks) and huey.contrib.djhuey is not in use"
    )


def huey_send(call: dict[str, Any]) -> None:
    """Huey: a new task of that name, from the Huey instance's registry, enqueued on it."""
    instance = _huey_instance()
    if call.get("huey") is not None and call["huey"] != instance.name:
        raise RuntimeError(
            f"the task was a task of the Huey {call['huey']!r}, this process sends on "
            f"{instance.name!r}"
        )
    task_class = instance._registry.string_to_task(call["task"])  # HueyException: unknown
    task = task_class(
        args=tuple(call["args"]), kwargs=call["kwargs"], priority=call.get("priority")
    )
    instance.enqueue(task)


def _importable(path: object) -> bool:
    """Whether ``path`` names a module-level callable by dotted path (no ``<lambda>``,
    ``<locals>``, no bound method): what a worker can import to run it again."""
    return isinstance(path, str) and "." in path and "<" not in path


#: The RQ job's options sent again with it, in seconds (or None): what ``enqueue_call``
#: takes by these names. Not its meta, callbacks, dependencies or ``Retry``, which JSON
#: cannot always hold or which belonged to the first job.
_RQ_OPTIONS = ("timeout", "result_ttl", "failure_ttl", "ttl")


def rq_describe() -> dict[str, Any] | None:
    """RQ: the current job's function (dotted path), arguments, queue (``origin``) and
    timeouts (``_RQ_OPTIONS``); None for a job of an instance's method (``job.instance``),
    which a name cannot reach."""
    job = running.rq_job()
    if job is None or job.instance is not None or not _importable(job.func_name):
        return None
    return {
        "task": job.func_name,
        "args": list(job.args or ()),
        "kwargs": dict(job.kwargs or {}),
        "queue": job.origin,
        **{name: getattr(job, name, None) for name in _RQ_OPTIONS},
    }


def rq_send(call: dict[str, Any]) -> None:
    """RQ: ``enqueue_call`` on the original job's queue (by name), with its timeouts, over
    the Redis connection (and with the serializer) of the job the holder runs in; outside
    a job, django-rq's connection for that queue (``RQ_QUEUES``); else it raises (the send
    is logged)."""
    job = running.rq_job()
    if job is not None:  # so RQ is imported
        module: Any = sys.modules["rq"]
        queue = module.Queue(call["queue"], connection=job.connection, serializer=job.serializer)
    elif "django_rq" in sys.modules:
        queue = sys.modules["django_rq"].get_queue(call["queue"])
    else:
        raise RuntimeError(
            "no RQ job runs in the holder, and django-rq is not imported: no Redis "
            f"connection to send {call['task']} to queue {call['queue']!r}"
        )
    options = {name: call[name] for name in _RQ_OPTIONS if call.get(name) is not None}
    queue.enqueue_call(func=call["task"], args=call["args"], kwargs=call["kwargs"], **options)


# django-q2 and Django's Tasks framework name no task running now: their worker's signals,
# sent before and after a task runs, say so (connected by install(), see _connect_signals).
# A stack per context: a task run inside another (a synchronous run) restores the outer one.
# Each entry: the framework, the fields of its task, and the task's result object (Django's
# Tasks framework; None for django-q2), which tells a task that has ended.
_running: ContextVar[tuple[tuple[str, dict[str, Any], Any], ...]] = ContextVar(
    "django_tasklock_running_tasks", default=()
)


def _push(framework: str, fields: dict[str, Any] | None, result: Any = None) -> None:
    _running.set((*_running.get(), (framework, fields or {}, result)))


def _pop(framework: str) -> None:
    stack = _running.get()
    if stack and stack[-1][0] == framework:
        _running.set(stack[:-1])


def _top(framework: str) -> dict[str, Any] | None:
    """The fields of ``framework``'s task running now, innermost; None when none does or the
    innermost can not be sent again (pushed as empty fields).

    An entry whose task has ended is dropped first: its ``task_finished`` did not reach
    us (a receiver that ran before ours raised). The immediate backend runs tasks on the
    caller's thread, so its entry would outlive it there, and describe a later call made
    outside any task (in a web process, the next request's) as that task.
    """
    stack = kept = _running.get()
    while kept and _ended(kept[-1][2]):
        kept = kept[:-1]
    if kept is not stack:
        _running.set(kept)
    if not kept or kept[-1][0] != framework:
        return None
    return kept[-1][1] or None


def _ended(result: Any) -> bool:
    """Whether a Django task's result says it has returned or raised (its status is set
    so before ``task_finished``); False for an entry with no result (django-q2's)."""
    return getattr(result, "is_finished", False) is True


#: django-q2's task options kept when its call is sent again (each as the original had it).
_Q2_OPTIONS = ("group", "hook", "save", "cluster", "ack_failure", "cached")


def _q2_started(sender: Any, task: dict[str, Any], **kwargs: Any) -> None:
    """django-q2's ``pre_execute``: the worker is about to run ``task``."""
    func = task.get("func")
    if not isinstance(func, str) and callable(func):  # async_task(callable)
        func = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', '')}"
    options = {k: task[k] for k in _Q2_OPTIONS if k in task}
    if callable(options.get("hook")):
        hook = options["hook"]
        options["hook"] = f"{hook.__module__}.{hook.__qualname__}"
    # Never empty (async_task takes option keys from the function's kwargs when it is):
    # ack_failure as the original had it, False when unset.
    options["ack_failure"] = bool(options.get("ack_failure", False))
    fields = {
        "task": func,
        "args": list(task.get("args") or ()),
        "kwargs": dict(task.get("kwargs") or {}),
        "q_options": options,
    }
    _push("django-q2", fields if _importable(func) else None)


def _q2_finished(sender: Any, **kwargs: Any) -> None:
    """django-q2's ``post_execute_in_worker``: the task has returned or raised."""
    _pop("django-q2")


def django_q2_describe() -> dict[str, Any] | None:
    """django-q2: the task its worker runs now (told by ``pre_execute``): function (dotted
    path), arguments, and the options kept (group, hook, save, cluster, ack_failure, cached)."""
    return _top("django-q2")


def django_q2_send(call: dict[str, Any]) -> None:
    """django-q2: ``async_task`` by dotted path, the options in ``q_options`` (so that none
    of the function's keyword arguments is taken for one)."""
    async_task: Any = importlib.import_module("django_q.tasks").async_task
    async_task(call["task"], *call["args"], q_options=dict(call["q_options"]), **call["kwargs"])


#: ``contrib.django_tasks.CLAIM``: unique_on's claim, never sent again (a new enqueue claims).
_UNIQUE_CLAIM = "tasklock_unique"


def _tasks_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """Django's Tasks framework's ``task_started``: a worker is about to run ``task_result``."""
    task = task_result.task
    fields = {
        "task": task.module_path,
        "args": list(task_result.args),
        "kwargs": {k: v for k, v in task_result.kwargs.items() if k != _UNIQUE_CLAIM},
        "backend": task.backend,
        "queue_name": task.queue_name,
        "priority": task.priority,
    }
    _push("django.tasks", fields if _importable(task.module_path) else None, task_result)


def _tasks_finished(sender: Any, **kwargs: Any) -> None:
    """Django's Tasks framework's ``task_finished``: the task has returned or raised."""
    _pop("django.tasks")


def django_tasks_describe() -> dict[str, Any] | None:
    """Django's Tasks framework: the task a worker runs now (told by ``task_started``): its
    module path, arguments, backend, queue and priority."""
    return _top("django.tasks")


def django_tasks_send(call: dict[str, Any]) -> None:
    """Django's Tasks framework: the task (``import_string`` of its path) enqueued again on
    the original's backend, queue and priority."""
    task: Any = import_string(call["task"])
    task.using(
        backend=call["backend"], queue_name=call["queue_name"], priority=call["priority"]
    ).enqueue(*call["args"], **call["kwargs"])


#: The signals that tell which task runs (module, started, finished, our receivers): each
#: connected when its module is there (see _connect_signals).
_SIGNALS = (
    ("django_q.signals", "pre_execute", "post_execute_in_worker", _q2_started, _q2_finished),
    ("django.tasks.signals", "task_started", "task_finished", _tasks_started, _tasks_finished),
    ("django_tasks.signals", "task_started", "task_finished", _tasks_started, _tasks_finished),
)


def _connect_signals() -> None:
    """Connect the receivers that know the running task, for each framework present.

    At ``ready()`` every installed app's package is imported (Django imports
    them all before it calls any ``ready()``), whatever the order of
    ``INSTALLED_APPS``: django-q2 and the django-tasks backport are installed
    apps (their workers need them to be), so their package is in
    ``sys.modules`` then, and only then their ``signals`` module is imported
    (as their own ``ready()`` does). ``django.tasks`` (Django >= 6.0) is
    Django's own: connected when Django has it. A worker process that starts
    afresh sets Django up, so this runs in it too; a forked one inherits it.
    """
    for module, started, finished, on_started, on_finished in _SIGNALS:
        package = module.rsplit(".", 1)[0]
        if package == "django.tasks":
            if importlib.util.find_spec(package) is None:
                continue
        elif package not in sys.modules:
            continue
        signals: Any = importlib.import_module(module)
        uid = f"django_tasklock.reruns.{module}"
        getattr(signals, started).connect(on_started, dispatch_uid=f"{uid}.started")
        getattr(signals, finished).connect(on_finished, dispatch_uid=f"{uid}.finished")


SENDERS: tuple[Sender, ...] = (
    Sender("Celery", celery_describe, celery_send),
    Sender("RQ", rq_describe, rq_send),
    Sender("Dramatiq", dramatiq_describe, dramatiq_send),
    Sender("Huey", huey_describe, huey_send),
    Sender("django-q2", django_q2_describe, django_q2_send),
    Sender("django.tasks", django_tasks_describe, django_tasks_send),
)


def install() -> None:
    """Register every framework's sender, and connect the signals that tell which task
    runs where a framework names none (the app's ``ready()`` does)."""
    for sender in SENDERS:
        register_sender(sender)
    _connect_signals()
