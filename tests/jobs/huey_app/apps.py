"""Where a project installs django-tasklock's lock methods on djhuey's Huey: ready()."""

from __future__ import annotations

from django.apps import AppConfig


class HueyAppConfig(AppConfig):
    name = "tests.jobs.huey_app"

    def ready(self) -> None:
        from huey.contrib.djhuey import HUEY

        from django_tasklock.contrib.huey import install

        # HUEY.lock_task, is_locked and flush_locks (run_huey --flush-locks), and the
        # hooks by which on_locked="retry" knows the task a consumer runs.
        install(HUEY)
