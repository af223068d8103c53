from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.signals import setting_changed

# What the chosen backend is built from (TASKLOCK_DEFAULTS is read per call).
_PROVIDER_SETTINGS = {
    "TASKLOCK_BACKEND",
    "TASKLOCK_DATABASE",
    "TASKLOCK_REDIS_CACHE",
    "TASKLOCK_REDIS_URL",
    "CACHES",
    "DATABASES",
    "INSTALLED_APPS",
}


def _forget_backend(*, setting: str, **kwargs: Any) -> None:
    if setting in _PROVIDER_SETTINGS:
        from django_tasklock.backends import reset_backend

        reset_backend()
    elif setting == "TASKLOCK_OPENTELEMETRY":
        _observe()


def _observe() -> None:
    """Install the OpenTelemetry observer when ``TASKLOCK_OPENTELEMETRY`` says so, or remove it.

    Imported only then: without the setting, nothing imports ``opentelemetry``.
    With it and without the ``otel`` extra, ``MissingFramework`` names the extra.
    """
    from django_tasklock.conf import conf
    from django_tasklock.leases import observe

    if conf.OPENTELEMETRY:
        from django_tasklock.contrib import otel

        otel.enable()
    else:
        observe.install(None)


class TaskLockConfig(AppConfig):
    name = "django_tasklock"
    verbose_name = "Task locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django_tasklock.checks import (
            check_health_setting,
            check_lock_health,
            check_lock_storage,
            check_tasklock_settings,
        )
        from django_tasklock.contrib.checks import check_integrations

        checks.register(check_tasklock_settings)
        checks.register(check_integrations)
        checks.register(check_health_setting, "tasklock")
        # Reads the storage: only with --deploy (``check --deploy --tag tasklock``).
        checks.register(check_lock_health, "tasklock", deploy=True)
        checks.register(check_lock_storage, "tasklock", deploy=True)

        setting_changed.connect(_forget_backend, dispatch_uid="django_tasklock.reset")
        _observe()
        from django_tasklock.contrib import reruns, retries  # they import no framework

        retries.install()
        reruns.install()
