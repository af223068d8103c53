"""A waiter in a thread of the test process, and what its work returned or raised."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django_tasklock.testing import ContractBackend


def in_thread(
    backend: ContractBackend, work: Callable[[], object]
) -> tuple[threading.Thread, list[object]]:
    """Run ``work`` in a daemon thread (a failing case leaves it asleep); its outcome, after."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as error:
            outcome.append(error)
        finally:
            backend.backend.close()  # this thread's connections

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome
