"""``django_tasklock.E020``: a setting names an integration whose framework is missing."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_tasklock.contrib import ALIASES, INTEGRATIONS, missing_message

# ``django_tasklock.contrib.celery.database.LeaderDatabaseScheduler``, or with a
# ``:`` before the attribute (Celery's spelling of a class).
_NAMED = re.compile(r"\bdjango_tasklock\.contrib\.\w+(?:[.:]\w+)*")

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


def _needed(path: str) -> Iterator[str]:
    """The integrations a dotted path under ``django_tasklock.contrib`` needs, outermost first."""
    parts = path.replace(":", ".").split(".")
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if prefix in INTEGRATIONS:
            yield prefix
        if prefix in ALIASES:
            yield ALIASES[prefix]


def named_integrations() -> dict[str, tuple[str, str]]:
    """``{integration: (setting, path)}`` for each integration a setting names by dotted path.

    ``path`` is the setting's text that names it (``django_tasklock.contrib.celery:
    LeaderDatabaseScheduler`` needs both ``celery`` and ``celery.database``).
    """
    named: dict[str, tuple[str, str]] = {}
    for setting, value in _project_settings():
        for text in _strings(value):
            for path in _NAMED.findall(text):
                for name in _needed(path.removeprefix("django_tasklock.contrib.")):
                    named.setdefault(name, (setting, path))
    return named


def check_integrations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for name, (setting, path) in sorted(named_integrations().items()):
        message = missing_message(name)
        if message is not None:
            errors.append(
                checks.Error(
                    f"{setting} names {path}, but {message}",
                    hint=f"Install it ({INTEGRATIONS[name].install}), or take {path} out of "
                    f"{setting}.",
                    id="django_tasklock.E020",
                )
            )
    return errors
