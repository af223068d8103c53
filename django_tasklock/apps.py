from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


def _forget_provider(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("TASKLOCK_") or setting in {"CACHES", "DATABASES"}:
        from django_tasklock.backends import reset_provider

        reset_provider()


class TaskLockConfig(AppConfig):
    name = "django_tasklock"
    verbose_name = "Task locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django_tasklock import checks  # noqa: F401 - registers the system checks

        setting_changed.connect(_forget_provider, dispatch_uid="django_tasklock.reset")
