from __future__ import annotations

from django.apps import AppConfig


class ExampleAppConfig(AppConfig):
    name = "exampleapp"
    verbose_name = "django-tasklock example"
