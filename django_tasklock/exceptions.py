"""Exceptions raised by django-tasklock."""

from __future__ import annotations


class TaskLockError(Exception):
    """Base class of django-tasklock's own errors."""


class LockNotAcquired(TaskLockError):
    """The lock could not be acquired (raised only where the API says so)."""
