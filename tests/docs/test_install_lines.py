"""Every install line works as pasted: django-tasklock is on no package index.

A line or hint that says ``pip install 'django-tasklock[huey]'`` fails with "No
matching distribution". The docs name the framework's own package (what the
extra installs) or the path form of a clone, ``'/path/to/django-tasklock[huey]'``;
the package's hints (``MissingFramework``, ``django_tasklock.E020``) the framework's
package. Only the sentence saying that the bare name finds nothing may name it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXTS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "django_tasklock").rglob("*.py")]
)
# django-tasklock named as something pip fetches: bare, or with extras, not after a path.
FROM_AN_INDEX = re.compile(r"""(?<![/\w.-])django-tasklock(\[[\w,-]+\])?(?=['"`\s]|$)""")


def _install_lines(path: Path) -> list[tuple[int, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for number, line in enumerate(lines, 1):
        if "pip install" not in line:
            continue
        what = line.split("pip install", 1)[1]
        if not what.strip(" `'\"") and number < len(lines):
            what = lines[number]  # wrapped: what it installs is on the next line
        if FROM_AN_INDEX.search(what):
            found.append((number, line.strip()))
    return found


@pytest.mark.parametrize("path", TEXTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_install_line_names_django_tasklock_from_an_index(path: Path) -> None:
    bad = [
        (number, line)
        for number, line in _install_lines(path)
        if "finds" not in line  # "pip install django-tasklock finds nothing"
    ]
    assert bad == [], f"{path.name}: install lines that fail as pasted: {bad}"


def test_the_check_works() -> None:
    assert FROM_AN_INDEX.search(" 'django-tasklock[huey]'")
    assert FROM_AN_INDEX.search(" django-tasklock ")
    assert not FROM_AN_INDEX.search(" '/path/to/django-tasklock[huey]'")
    assert not FROM_AN_INDEX.search(" 'huey>=2.5'")
