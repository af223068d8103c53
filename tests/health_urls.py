"""A django-health-check view with the task locks' check (ops/test_health_check_plugin.py)."""

from __future__ import annotations

from django.urls import path
from health_check.views import HealthCheckView

urlpatterns = [
    path(
        "ht/",
        HealthCheckView.as_view(checks=["django_tasklock.contrib.health_check.TaskLocks"]),
        name="tasklock-health",
    ),
    path(
        "ht/keys/",
        HealthCheckView.as_view(
            checks=[("django_tasklock.contrib.health_check.TaskLocks", {"show_keys": True})]
        ),
        name="tasklock-health-keys",
    ),
]
