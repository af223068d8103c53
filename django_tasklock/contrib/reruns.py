"""The senders of ``on_locked="rerun"``: each framework's way to send a skipped task call
once more (``api.rerun``).

Installed when the app is ready (:func:`install`), for every framework at
once: each looks for its framework among the modules already imported
(``sys.modules``), never importing one. ``describe`` gives the call of a task
of it running now (name and arguments, as JSON); ``send`` enqueues such a
call, in the holder's process. A framework without a sender here leaves the
holder to run its own work again, in-line.
"""

from __future__ import annotations

import sys
from typing import Any

from django_tasklock.api.rerun import Sender, register_sender


def _celery_task() -> Any:
    """The Celery task a worker runs now (``called_directly``: none), or None."""
    task: Any = getattr(sys.modules.get("celery"), "current_task", None)
    return task if task and not task.request.called_directly else None


def celery_describe() -> dict[str, Any] | None:
    """Celery: the running task's name and arguments (``request.args``, ``request.kwargs``)."""
    task = _celery_task()
    if task is None:
        return None
    request = task.request
    return {"task": task.name, "args": list(request.args or ()), "kwargs": request.kwargs or {}}


def celery_send(call: dict[str, Any]) -> None:
    """Celery: ``send_task`` by name on the current app (routed as the app routes it)."""
    app: Any = sys.modules["celery"].current_app
    app.send_task(call["task"], args=call["args"], kwargs=call["kwargs"])


SENDERS: tuple[Sender, ...] = (Sender("Celery", celery_describe, celery_send),)


def install() -> None:
    """Register every framework's sender (the app's ``ready()`` does)."""
    for sender in SENDERS:
        register_sender(sender)


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


def _dramatiq_message() -> Any:
    """The Dramatiq message whose actor this thread runs now, or None: Dramatiq's
    ``CurrentMessage`` middleware's, else the one our ``TaskLock`` notes (as the retrier)."""
    if "dramatiq" not in sys.modules:
        return None
    message: Any = None
    current: Any = sys.modules.get("dramatiq.middleware.current_message")
    if current is not None:
        message = current.CurrentMessage.get_current_message()
    ours: Any = sys.modules.get("django_tasklock.contrib.dramatiq")
    if message is None and ours is not None:
        message = ours.current_message()
    return message


def dramatiq_describe() -> dict[str, Any] | None:
    """Dramatiq: the running message's actor, queue, arguments and run options
    (:data:`DRAMATIQ_OPTIONS`); None where no message is known (neither ``TaskLock``
    nor ``CurrentMessage`` on the broker; an ``async def`` actor)."""
    message = _dramatiq_message()
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
    module: Any = sys.modules.get("django_tasklock.contrib.huey")
    running = module.current_task() if module is not None else None
    if running is None:
        return None
    instance, task = running
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
    module: Any = sys.modules.get("django_tasklock.contrib.huey")
    running = module.current_task() if module is not None else None
    if running is not None:
        return running[0]
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


SENDERS += (
    Sender("Dramatiq", dramatiq_describe, dramatiq_send),
    Sender("Huey", huey_describe, huey_send),
)
