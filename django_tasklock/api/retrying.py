"""``on_locked="retry"``: a task that finds its key held is retried later by its own framework.

No worker blocks (as ``wait=`` would), and the work is not dropped (as a skip
drops it): the framework runs the task again after a jittered countdown that
doubles with each try (:class:`RetryBackoff`), for a bounded number of tries;
the last one, finding the key still held, ends as skipped, as without it.

The core knows no task framework. A framework whose tasks can ask for a
retry of their own registers a *retrier* (``django_tasklock.contrib.retries``
does, for every such framework, when the app is ready): called when the key
is held, it says whether the code running is one of its tasks and, if so,
how to retry it (:class:`RetryPlan`). Code that runs in no such task (called
directly, or a task of a framework without retries: Django's tasks,
django-q2) gets :class:`RetryUnavailable`, naming what to use instead.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from django_tasklock.api.skipped import RETRY, SKIPPED, report_skipped
from django_tasklock.exceptions import RetryUnavailable

if TYPE_CHECKING:
    from django_tasklock.locking.lock import Lock


@dataclasses.dataclass(frozen=True)
class RetryBackoff:
    """When the retries of a task that found its key held come.

    Try ``n`` (from 1, the first run) that finds the key held asks for the
    next after :meth:`countdown` seconds: ``first * 2 ** (n - 1)``, at most
    ``most``, jittered down by up to half (so that tasks held back together
    do not all come back together). ``tries`` runs in all, the first
    included: the last ends as skipped.
    """

    first: float = 1.0
    most: float = 60.0
    tries: int = 8

    def countdown(self, attempt: int) -> float:
        """Seconds before the next try, after try ``attempt`` (from 1) found the key held."""
        return float(min(self.most, self.first * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0))

    def bound(self) -> float:
        """The most time all retries can take, from the first run's end (no jitter)."""
        return float(sum(min(self.most, self.first * 2**n) for n in range(self.tries - 1)))


DEFAULT_BACKOFF = RetryBackoff()


@dataclasses.dataclass(frozen=True)
class RetryPlan:
    """How a retrier retries the running task (see the module).

    ``attempt``: this try's number (from 1); ``countdown``: seconds before
    the next, or None when this is the last (the call then ends as skipped);
    ``act``: what asks the framework for the retry (it raises the framework's
    retry, or returns what the task returns to ask for one).
    """

    framework: str
    attempt: int
    countdown: float | None
    act: Callable[[], Any]


class Retrier(Protocol):
    def __call__(self, backoff: RetryBackoff) -> RetryPlan | None:
        """How to retry the task running now; None when none of this framework's runs."""


_retriers: list[Retrier] = []


def register(retrier: Retrier) -> None:
    """Ask ``retrier`` too when a key is held under ``on_locked="retry"`` (once)."""
    if retrier not in _retriers:
        _retriers.append(retrier)


def retry_later(lock: Lock, name: str, backoff: RetryBackoff = DEFAULT_BACKOFF) -> Any:
    """The key of ``lock`` was held: have the running task retried, or end it as skipped.

    Reports the skip first (``"retry"``, or ``"skipped"`` on the last try),
    then returns what the plan's ``act`` returns, or None on the last try;
    ``act`` may raise (the framework's retry). ``RetryUnavailable`` (after
    the skip is reported) where no retrier knows the running code.
    """
    plan = next((found for retrier in _retriers if (found := retrier(backoff))), None)
    if plan is None:
        report_skipped(lock, name)
        raise RetryUnavailable(lock.key)
    if plan.countdown is None:
        report_skipped(lock, name, SKIPPED, f" It was try {plan.attempt} of {backoff.tries}.")
        return None
    detail = (
        f" {plan.framework} runs it again in {plan.countdown:.1f} s "
        f"(try {plan.attempt + 1} of {backoff.tries})."
    )
    report_skipped(lock, name, RETRY, detail)
    return plan.act()
