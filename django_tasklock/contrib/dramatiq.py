"""Run-time exclusion for Dramatiq actors: the ``exclusive`` actor option, and its middleware.

Add :class:`TaskLock` to the broker's middleware (django-dramatiq:
``"django_tasklock.contrib.dramatiq.TaskLock"`` in ``DRAMATIQ_BROKER["MIDDLEWARE"]``),
then declare ``@dramatiq.actor(exclusive="rollups:{day}")``. The middleware
runs the actor's function under :func:`django_tasklock.exclusive` with that
key. A message whose key is held is, as Dramatiq's own middleware does it:

- ``when_held="skip"`` (the default): skipped — ``SkipMessage``, acked, the
  ``after_skip_message`` hooks run, the worker logs "was skipped";
- ``when_held="retry"``: raised as ``dramatiq.Retry`` for the ``Retries``
  middleware, which sends it again after its backoff, up to ``max_retries``.

The middleware also notes the message whose actor runs in each worker
thread (:func:`current_message`): ``on_locked="retry"`` of ``@exclusive``
finds the message to retry by it (or by Dramatiq's ``CurrentMessage``
middleware, when that is on the broker instead).

Bad options (an unknown lock option, a key template naming no argument, a
wrong ``when_held``) are refused when the actor is declared, by an
:class:`ExclusiveOptionError` naming the actor and the option; the lock
options' values are checked at each run, as by ``@exclusive``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Literal

from django_tasklock.api.decorators import exclusive
from django_tasklock.contrib import require

require("dramatiq")

from dramatiq import Actor, Broker, MessageProxy, Middleware, Retry  # noqa: E402
from dramatiq.middleware import MiddlewareError, SkipMessage  # noqa: E402

WhenHeld = Literal["skip", "retry"]
WHEN_HELD: tuple[WhenHeld, ...] = ("skip", "retry")

__all__ = ["WHEN_HELD", "ExclusiveOptionError", "TaskLock", "WhenHeld", "current_message"]

#: The message whose actor runs in this worker thread now (set by :class:`TaskLock`).
_MESSAGE: ContextVar[MessageProxy | None] = ContextVar(
    "django_tasklock_dramatiq_message", default=None
)


def current_message() -> MessageProxy | None:
    """The message whose actor this worker thread runs now; None elsewhere.

    Known where :class:`TaskLock` is on the broker, for synchronous actors
    (an ``async def`` actor runs on the event loop's thread, which does not
    see it), as Dramatiq's own ``CurrentMessage`` middleware knows it.
    """
    return _MESSAGE.get()


class ExclusiveOptionError(MiddlewareError, ValueError):
    """An actor's ``exclusive``, ``exclusive_options`` or ``when_held`` is wrong.

    A ``MiddlewareError``, so that Dramatiq lets it out of the actor's declaration.
    """


class TaskLock(Middleware):
    """Accepts the ``exclusive``, ``exclusive_options`` and ``when_held`` actor options.

    - ``exclusive``: the lock key — a ``str.format`` template over the actor's
      arguments (``"rollups:{day}"``), a callable taking them, or ``True`` for
      the function's dotted name; ``None``, ``False`` or absent: no lock.
    - ``exclusive_options``: a dict of :func:`django_tasklock.exclusive`'s
      keyword options (``ttl``, ``refresh_interval``, ``max_lifetime``,
      ``wait``, ``min_hold``, ``fencing``, ``progress_timeout``, ``on_lost``).
    - ``when_held``: ``"skip"`` (the default) or ``"retry"``.
    """

    @property
    def actor_options(self) -> set[str]:
        return {"exclusive", "exclusive_options", "when_held"}

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        _MESSAGE.set(message)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        _MESSAGE.set(None)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        _MESSAGE.set(None)

    def before_declare_actor(self, broker: Broker, actor: Actor[Any, Any]) -> None:
        options = actor.options
        key = options.get("exclusive")
        if key is None or key is False:
            for name in ("exclusive_options", "when_held"):
                if name in options:
                    raise ExclusiveOptionError(
                        f"actor {actor.actor_name!r}: {name}= needs exclusive= (the lock key)"
                    )
            return
        try:
            actor.fn = locked(
                actor.fn,
                None if key is True else key,
                options.get("exclusive_options", {}),
                options.get("when_held", "skip"),
            )
        except (TypeError, ValueError) as exc:
            raise ExclusiveOptionError(f"actor {actor.actor_name!r}: {exc}") from exc


def locked(
    fn: Callable[..., Any], key: Any, lock_options: Any, when_held: Any
) -> Callable[..., Any]:
    """``fn`` under ``@exclusive(key=key, **lock_options)``; held: skip or retry."""
    if not (key is None or isinstance(key, str) or callable(key)):
        raise TypeError(
            f"exclusive must be a key template, a key function or True, not {type(key).__name__}"
        )
    if not isinstance(lock_options, dict):
        raise TypeError(f"exclusive_options must be a dict, not {type(lock_options).__name__}")
    for name in ("key", "on_locked"):
        if name in lock_options:
            raise TypeError(
                f"exclusive_options takes no {name!r}: the key is exclusive=, and "
                "when_held= says what a held key does"
            )
    if when_held not in WHEN_HELD:
        raise ValueError(f"when_held must be one of {WHEN_HELD}, not {when_held!r}")

    def held(*args: Any, **kwargs: Any) -> None:
        if when_held == "retry":
            raise Retry("its task lock is held elsewhere")
        raise SkipMessage("its task lock is held elsewhere")

    return exclusive(key=key, on_locked=held, **lock_options)(fn)
