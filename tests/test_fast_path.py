"""What the fast path remembers follows the settings and the process."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from django_tasklock.options import DEFAULT_TTL, LockOptions


def test_remembered_options_follow_tasklock_defaults() -> None:
    assert LockOptions.resolve().ttl == DEFAULT_TTL
    with override_settings(TASKLOCK_DEFAULTS={"ttl": 60}):
        assert LockOptions.resolve().ttl == timedelta(seconds=60)
        assert LockOptions.resolve(ttl=30).refresh_interval == timedelta(seconds=10)
    assert LockOptions.resolve().ttl == DEFAULT_TTL
    assert LockOptions.resolve(ttl=30).refresh_interval == timedelta(seconds=10)


def test_remembered_options_never_take_true_for_one() -> None:
    assert LockOptions.resolve(ttl=1).ttl == timedelta(seconds=1)
    with pytest.raises(TypeError, match="ttl"):
        LockOptions.resolve(ttl=True)


def test_unhashable_options_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="refresh_interval"):
        LockOptions.resolve(refresh_interval=[1])  # type: ignore[arg-type]
