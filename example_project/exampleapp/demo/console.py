"""The demo's own narration, flushed at once so that it interleaves with the workers'."""

from __future__ import annotations

from django.core.management.base import OutputWrapper
from django.core.management.color import Style


class Console:
    def __init__(self, out: OutputWrapper, style: Style) -> None:
        self._out = out
        self._style = style

    def _write(self, text: str) -> None:
        self._out.write(text)
        self._out.flush()

    def heading(self, text: str) -> None:
        self._write("")
        self._write(self._style.MIGRATE_HEADING(text))

    def say(self, text: str) -> None:
        self._write(text)

    def ok(self, text: str) -> None:
        self._write(self._style.SUCCESS(text))

    def fail(self, text: str) -> None:
        self._write(self._style.ERROR(text))
