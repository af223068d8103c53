"""MkDocs hooks, and a griffe extension for the API reference.

The benchmark's chart, kept where ``bench/run.py`` writes it:
``docs/speed.md`` shows ``../bench/results.png``, the path that is right on
GitHub, outside the docs directory MkDocs builds from. ``on_files`` adds the
file to the site as ``bench/results.png`` and ``on_page_markdown`` points the
page there, so that the strict build checks that the chart exists instead of
warning about it.

``SphinxRolesAsCode`` (named in mkdocs.yml's mkdocstrings options): the
docstrings are Google style with a few Sphinx habits, ``:class:`Lock``` and a
paragraph ending ``::`` before a literal block. Rendered as Markdown these
would show their markup; the extension turns a role into inline code of the
name (its last part after a ``~``: ``:class:`~django_tasklock.locking.lock.Lock```
reads ``Lock``), linked to the object's entry when the API reference shows it
(an optional cross-reference: one it does not show stays plain code, with no
warning), and ``::`` into ``:`` (the indented block after it is code in
Markdown too). An attribute's ``#:`` comment, the other Sphinx habit here,
becomes its docstring.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent
CHART = "bench/results.png"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, CHART, abs_src_path=str(ROOT / CHART)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return markdown.replace(f"](../{CHART})", f"]({CHART})")


_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|exc|mod|obj):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(?<=\S)::$", re.MULTILINE)
# reST's escaped space after inline code: ``await``\ ed reads "awaited".
_JOINED = re.compile(r"(?<=`)\\ ")


def sphinx_roles_as_code(text: str, scope: griffe.Object | None = None) -> str:
    """``:meth:`Lock.release``` -> ``Lock.release``, linked if ``scope`` resolves ``Lock``."""

    def code(match: re.Match[str]) -> str:
        target = match.group(2).removesuffix("()")
        shown = f"<code>{target.rsplit('.', 1)[-1] if match.group(1) else target}</code>"
        path = None if scope is None else _resolve(target, scope)
        if path is None:
            return shown
        return f'<autoref identifier="{path}" optional>{shown}</autoref>'

    return _JOINED.sub("", _LITERAL.sub(":", _ROLE.sub(code, text)))


def _resolve(target: str, scope: griffe.Object) -> str | None:
    """The full path ``target`` names in ``scope``'s docstring, looked up as Python would."""
    if target.startswith("django_tasklock."):
        return target
    first, dot, rest = target.partition(".")
    try:
        return scope.resolve(first) + dot + rest
    except griffe.NameResolutionError:
        return None


def _comment_docstring(attr: griffe.Object) -> griffe.Docstring | None:
    """An attribute's ``#:`` comment lines right above it, as its docstring (Sphinx's habit)."""
    if attr.lineno is None or not isinstance(attr.filepath, Path):
        return None
    lines = attr.lines_collection[attr.filepath]
    comment: list[str] = []
    number = attr.lineno - 1  # the line above, counted from 1
    while number >= 1 and lines[number - 1].lstrip().startswith("#:"):
        comment.insert(0, lines[number - 1].lstrip()[2:].strip())
        number -= 1
    if not comment:
        return None
    return griffe.Docstring("\n".join(comment), lineno=number + 1, parent=attr)


class SphinxRolesAsCode(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        # Once the package is loaded whole, so that every name can be resolved.
        objects: list[griffe.Object] = [pkg]
        while objects:
            obj = objects.pop()
            if obj.docstring is None and obj.is_attribute:
                obj.docstring = _comment_docstring(obj)
            if obj.docstring is not None:
                obj.docstring.value = sphinx_roles_as_code(obj.docstring.value, obj)
            objects += [m for m in obj.members.values() if isinstance(m, griffe.Object)]
