"""No duplicate enqueues of a Celery task: ``@shared_task(base=UniqueTask, unique_on=...)``.

``apply_async()`` (and ``delay()``) take the task's unique key before sending,
and raise :class:`~django_tasklock.exceptions.AlreadyEnqueued` while an
identical task (same key) is queued or running. The key travels with the
message (a header); the worker that runs the task keeps the key's lease
alive, and frees it when the task returns, raises or is revoked (a ``Retry``
leaves it to the retry). A worker that dies, or a message that is lost, frees
it when the lease runs out (``unique_ttl``).
See docs/unique-tasks.md.
"""

from __future__ import annotations

from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Retry
from celery.signals import task_revoked

from django_tasklock.api.unique import claim, run_claimed, unclaim
from django_tasklock.durations import Duration
from django_tasklock.locking.keys import KeyBuilder, KeySpec

#: The message header carrying ``[key, token]``.
HEADER = "tasklock_unique"

DEFAULT_UNIQUE_TTL = 3600


class UniqueTask(Task):  # type: ignore[misc]
    """A Celery task base class: at most one identical task queued or running.

    Task options (``@shared_task(base=UniqueTask, unique_on="report:{user_id}")``):

    - ``unique_on``: the unique key, a ``str.format`` template over the task's
      parameters (as ``@exclusive``'s key) or a function of its arguments.
      None (the default) turns uniqueness off.
    - ``unique_ttl``: seconds the key stays held without a refresh (default
      3600): the longest a task may wait in the queue holding it, and how long
      after its worker died the key is freed. While the task runs, the
      worker's heartbeat refreshes it every ``unique_ttl / 3``.

    A message re-sent by the task itself (``self.retry()``) keeps the key it
    carries instead of taking it again, and the key stays held while it waits
    for its retry (up to ``unique_ttl``; see docs/unique-tasks.md).
    ``send_task()`` by name, which does not go through this class, takes no key.
    """

    unique_on: ClassVar[KeySpec] = None
    unique_ttl: ClassVar[Duration] = DEFAULT_UNIQUE_TTL

    def unique_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The unique key of a call with these arguments."""
        return KeyBuilder(self.run, _unique_on(self))(args, kwargs)

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> Any:
        """Take the unique key, then send; :class:`AlreadyEnqueued` if it is held."""
        headers = dict(options.pop("headers", None) or {})
        claimed = None
        if _unique_on(self) is not None and HEADER not in headers:
            key = self.unique_key(tuple(args or ()), dict(kwargs or {}))
            claimed = (key, claim(key, ttl=self.unique_ttl))
            headers[HEADER] = list(claimed)
        try:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow,
                headers=headers, **options,
            )  # fmt: skip
        except BaseException:
            if claimed is not None:  # never sent: nobody will free it
                unclaim(*claimed)
            raise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        claimed = _claim_of(self.request)
        if claimed is None:  # called directly, or sent without uniqueness
            return super().__call__(*args, **kwargs)
        key, token = claimed
        _, result = run_claimed(
            key,
            token,
            lambda: super(UniqueTask, self).__call__(*args, **kwargs),
            ttl=self.unique_ttl,
            name=self.name,
            sent_again=(Retry,),  # self.retry() sent it again with the claim
        )
        return result


def _unique_on(task: UniqueTask) -> KeySpec:
    """The ``unique_on`` option as given (a function given as a task option is not a method)."""
    for klass in type(task).__mro__:
        if "unique_on" in vars(klass):
            spec = vars(klass)["unique_on"]
            return spec.__func__ if isinstance(spec, staticmethod) else spec
    return None


def _claim_of(request: Any) -> tuple[str, str] | None:
    """``(key, token)`` from a task's request (its message headers), if it carries one."""
    value = getattr(request, HEADER, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(HEADER)
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return str(value[0]), str(value[1])
    return None


def _free_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """A revoked task (or one whose ``expires`` passed) frees its key at once."""
    claimed = _claim_of(request)
    if claimed is not None and isinstance(sender, UniqueTask):
        unclaim(*claimed)


task_revoked.connect(_free_revoked, weak=False)
