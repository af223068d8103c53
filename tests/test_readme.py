"""The README is the public contract: its examples run, its commands exist.

Python: every ```python block of README.md is executed, in order, in one
namespace, in this Django-configured test process (``tests.settings``: the
database backend on SQLite, migrated), as if pasted one after the other into
``manage.py shell``. A block that cannot run here (it needs Celery, say) is
skipped only when the line right before it is an HTML comment giving the
reason, invisible on the rendered page::

    <!-- readme-test: skip (needs Celery) -->

Shell: CI runs the two "Try it" commands itself (.ci/run). Here, every
``manage.py <command>`` named in a ```sh block or in inline code must be a
command of the example project (which installs django_tasklock), every
``'.[extra]'`` must be an extra of the package, and every repository path
a command names must exist. Paragraphs about planned work are not checked.

And the README, like everything shipped, cites only documents the
repository contains.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import metadata
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((.+?)\)\s*-->\s*$")


def code_blocks(language: str) -> list[tuple[int, str, str | None]]:
    """(line number, code, skip reason) of each block in ``language``."""
    blocks = []
    for match in _FENCE.finditer(README):
        if match.group(1) != language:
            continue
        before = README[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        line = README.count("\n", 0, match.start()) + 1
        blocks.append((line, match.group(2), skip.group(1) if skip else None))
    return blocks


def test_the_readme_has_python_examples() -> None:
    assert len(code_blocks("python")) >= 3


@pytest.mark.django_db(transaction=True)
def test_python_examples_run_in_order() -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    ran = 0
    for line, code, skip in code_blocks("python"):
        if skip is not None:
            continue
        # The file name in a traceback says which block failed.
        exec(compile(code, f"README.md, block at line {line}", "exec"), namespace)
        ran += 1
    assert ran >= 3


def test_skip_markers_give_a_reason() -> None:
    for comment in re.findall(r"<!--\s*readme-test.*?-->", README):
        assert _SKIP.search(comment), f"unknown README test marker: {comment}"


def _checked_text() -> str:
    """Shell blocks and inline code of the README, without paragraphs about plans."""
    shell = "\n".join(code for _, code, _ in code_blocks("sh"))
    prose = _FENCE.sub("", README)
    current = [p for p in prose.split("\n\n") if "planned" not in p.lower()]
    inline = re.findall(r"`([^`\n]+)`", "\n\n".join(current))
    return shell + "\n" + "\n".join(inline)


def example_project_commands() -> set[str]:
    # Not this process's settings (pytest-django sets DJANGO_SETTINGS_MODULE).
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "example_project" / "manage.py"), "help", "--commands"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    return set(done.stdout.split())


def test_manage_py_commands_named_in_the_readme_exist() -> None:
    named = set(re.findall(r"manage\.py\s+([a-z_]+)", _checked_text()))
    assert {"demo", "migrate", "check"} <= named  # the extractor still finds them
    assert named - example_project_commands() == set()


def test_extras_named_in_the_readme_exist() -> None:
    extras = set(metadata("django-tasklock").get_all("Provides-Extra") or [])
    named = set(re.findall(r"\[(\w+)\]'", _checked_text()))
    assert {"redis", "test", "dev"} <= named
    assert named - extras == set()


def test_paths_in_the_readme_commands_exist() -> None:
    paths = set(re.findall(r"(?<![\w/])((?:example_project|bench|tests|\.ci)/[\w./]*)", README))
    assert "example_project/manage.py" in paths
    assert [path for path in sorted(paths) if not (ROOT / path.rstrip(".")).exists()] == []


def _shipped_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "pyproject.toml"]
    for directory in ("django_tasklock", "example_project", "bench", ".ci"):
        files += [p for p in (ROOT / directory).rglob("*") if p.suffix in {".py", ".md", ""}]
    return [p for p in files if p.is_file()]


def test_nothing_shipped_cites_a_document_the_repository_lacks() -> None:
    # Spelled in pieces, so that this file does not cite itself.
    spec = re.compile(r"\bSP" + r"EC\b|\N{SECTION SIGN}|\b[Tt]he spe" + r"c\b")
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _shipped_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if spec.search(line)
    ]
    assert cited == []
