"""``django_tasklock.E020``: a setting names an integration whose framework is missing."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core import checks

from django_tasklock.contrib import INTEGRATIONS, missing_message

_NAMED = re.compile(r"\bdjango_tasklock\.contrib\.(\w+)")


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


def named_integrations() -> dict[str, str]:
    """``{integration: setting}`` for each integration a setting names by dotted path."""
    named: dict[str, str] = {}
    for setting in dir(settings):
        if not setting.isupper():
            continue
        with warnings.catch_warnings():
            # Reading a deprecated setting warns (DEFAULT_FILE_STORAGE on Django 4.2,
            # each EMAIL_* one on Django 6.1, set or not): this check reads every
            # setting, and only looks for dotted paths in them.
            warnings.simplefilter("ignore")
            value = getattr(settings, setting, None)
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
