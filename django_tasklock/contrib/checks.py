"""``django_tasklock.E020``: a setting names an integration whose framework is missing."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_tasklock.contrib import INTEGRATIONS, missing_message

_NAMED = re.compile(r"\bdjango_tasklock\.contrib\.(\w+)")

#: Settings never read: they cannot name a module, and Django refuses to give an
#: empty ``SECRET_KEY`` (``ImproperlyConfigured``), which ``check`` itself allows.
_NEVER_READ = frozenset({"SECRET_KEY", "SECRET_KEY_FALLBACKS"})


def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > 6:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _strings(item, depth + 1)


def _project_settings() -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of each setting the project set: Django's defaults name no integration.

    Only those, and never a secret: reading every setting ran into Django's own
    refusals (an unset ``SECRET_KEY``) and deprecation warnings.
    """
    for setting in dir(settings):
        if not setting.isupper() or setting in _NEVER_READ:
            continue
        # Public on Django's settings object; django-stubs leaves it out.
        if not settings.is_overridden(setting):  # type: ignore[misc]
            continue
        with warnings.catch_warnings():
            # A deprecated setting warns when read (DEFAULT_FILE_STORAGE on Django
            # 4.2, each EMAIL_* one on Django 6.1): this check only looks for dotted
            # paths in it.
            warnings.simplefilter("ignore")
            try:
                value = getattr(settings, setting, None)
            except ImproperlyConfigured:  # Django refuses to give it: no path to find
                continue
        yield setting, value


def named_integrations() -> dict[str, str]:
    """``{integration: setting}`` for each integration a setting names by dotted path."""
    named: dict[str, str] = {}
    for setting, value in _project_settings():
        for text in _strings(value):
            for name in _NAMED.findall(text):
                if name in INTEGRATIONS:
                    named.setdefault(name, setting)
    return named


def check_integrations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for name, setting in sorted(named_integrations().items()):
        message = missing_message(name)
        if message is not None:
            errors.append(
                checks.Error(
                    f"{setting} names django_tasklock.contrib.{name}, but {message}",
                    hint=f"Install the extra, or take django_tasklock.contrib.{name} out of "
                    f"{setting}.",
                    id="django_tasklock.E020",
                )
            )
    return errors
