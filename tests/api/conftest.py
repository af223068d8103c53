"""Fixtures of the API's tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_tasklock import lock_skipped


@pytest.fixture
def skipped() -> Iterator[list[dict[str, Any]]]:
    """The keyword arguments of every ``lock_skipped`` sent during the test."""
    sent: list[dict[str, Any]] = []

    def record(sender: Any, signal: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    lock_skipped.connect(record, weak=False)
    yield sent
    lock_skipped.disconnect(record)
