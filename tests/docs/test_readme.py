"""The README and the docs are the public contract: their examples run, their commands exist.

Python: every ```python block of README.md and of every page in docs/ is
executed on its own, in a fresh namespace, in this Django-configured test
process (``tests.settings``: the database backend on SQLite, migrated), as
if pasted alone into ``manage.py shell``: a block may not lean on names an
earlier block defined. Each block is one test, named by its file and line,
so the run lists how many blocks ran and which were skipped. A block that
cannot run here (it needs a model of yours, say) is skipped only when the
line right before it is an HTML comment giving the reason, invisible on the
rendered page::

    <!-- docs-test: skip (needs your Report model) -->

Shell: CI runs the README's commands itself (.ci/run). Here, every
``manage.py <command>`` named in a ```sh block or in inline code must be a
command of the example project (which installs django_tasklock), every
``'.[extra]'`` must be an extra of the package, and every repository path
named must exist. Paragraphs about planned work are not checked. The README
stays a landing page: at most 250 lines.

And nothing shipped, docs included, cites a document the repository lacks.
"""

from __future__ import annotations

import builtins
import os
import re
import subprocess
import symtable
import sys
from importlib.metadata import metadata
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support import services

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((.+?)\)\s*-->\s*$")


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def code_blocks(language: str, page: Path | None = None) -> list[tuple[str, int, str, str | None]]:
    """(file, line number, code, skip reason) of each block in ``language``."""
    blocks = []
    for path in PAGES if page is None else [page]:
        text = path.read_text()
        for match in _FENCE.finditer(text):
            if match.group(1) != language:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            skip = _SKIP.search(before)
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((_name(path), line, match.group(2), skip.group(1) if skip else None))
    return blocks


def test_the_readme_is_a_landing_page() -> None:
    assert len(README.splitlines()) <= 250
    assert len(code_blocks("python", ROOT / "README.md")) >= 3


def undefined_names(code: str) -> set[str]:
    """Global names the block uses but neither defines nor imports.

    Running a block proves only the lines it reached: a name used in an
    ``except`` branch that did not run, or in a function it did not call,
    is caught here.
    """
    top = symtable.symtable(code, "block", "exec")
    defined = set(dir(builtins)) | {
        s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()
    }
    used: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (table is top or symbol.is_global()):
                used.add(symbol.get_name())
        tables += table.get_children()
    return used - defined


def test_undefined_names_are_found() -> None:
    code = "import os\ntry:\n    os.sep\nexcept OSError:\n    log.info(os)\n"
    assert undefined_names(code) == {"log"}
    assert undefined_names("def f():\n    return service.x\n") == {"service"}
    assert undefined_names("service = 1\ndef f():\n    return service\n") == set()


_PYTHON = code_blocks("python")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("page", "line", "code", "skip"), _PYTHON, ids=[f"{p}:{n}" for p, n, _, _ in _PYTHON]
)
def test_python_block_runs_alone(page: str, line: int, code: str, skip: str | None) -> None:
    if skip is not None:
        pytest.skip(f"{page}:{line}: {skip}")
    assert undefined_names(code) == set(), "the block needs names it does not define"
    # A module name per block: a Celery task two blocks both define (say
    # rebuild_rollups) is then two task names, not one registered twice.
    module = re.sub(r"\W", "_", f"docs_example_{page}_{line}")
    namespace: dict[str, Any] = {"__name__": module}
    # The file name in a traceback says which block failed.
    try:
        exec(compile(code, f"{page}, block at line {line}", "exec"), namespace)
    except redis.exceptions.ConnectionError as exc:
        # A block that talks to Redis (django-rq's queue) on a machine with none:
        # skipped with the reason, as every Redis test is there (never under CI=true,
        # where a missing Redis fails the run before this).
        if "redis" not in services.missing:
            raise
        pytest.skip(f"{page}:{line} needs Redis: {services.missing['redis']} ({exc})")


def test_most_python_blocks_run() -> None:
    ran = [block for block in _PYTHON if block[3] is None]
    assert len(ran) >= 25
    assert len(ran) >= 4 * (len(_PYTHON) - len(ran))


def test_skip_markers_give_a_reason() -> None:
    for page in PAGES:
        for comment in re.findall(r"<!--\s*(?:docs|readme)-test.*?-->", page.read_text()):
            assert _SKIP.search(comment), f"unknown test marker in {_name(page)}: {comment}"


def _anchors(text: str) -> set[str]:
    """The #anchors of a page's headings, as GitHub and MkDocs spell them."""
    headings = re.findall(r"^#+ (.+)$", _FENCE.sub("", text), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}


def test_the_readmes_links_resolve() -> None:
    # MkDocs checks the links of docs/ (mkdocs build --strict); the README is not in the site.
    links = re.findall(r"\]\(([^)\s]+)\)", _FENCE.sub("", README))
    assert "docs/choosing-ttl.md" in links
    broken = []
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        if not target.exists() or (anchor and anchor not in _anchors(target.read_text())):
            broken.append(link)
    assert broken == []


def _checked_text() -> str:
    """Shell blocks and inline code of every page, without paragraphs about plans."""
    shell = "\n".join(code for _, _, code, _ in code_blocks("sh"))
    prose = "\n\n".join(_FENCE.sub("", page.read_text()) for page in PAGES)
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


def test_manage_py_commands_named_in_the_docs_exist() -> None:
    named = set(re.findall(r"manage\.py\s+([a-z_]+)", _checked_text()))
    assert {"demo", "migrate", "check"} <= named  # the extractor still finds them
    assert named - example_project_commands() == set()


def test_extras_named_in_the_docs_exist() -> None:
    extras = set(metadata("django-tasklock").get_all("Provides-Extra") or [])
    named = set(re.findall(r"\[(\w+)\]'", _checked_text()))
    assert {"redis", "test", "dev", "docs"} <= named
    assert named - extras == set()


def test_paths_named_in_the_docs_exist() -> None:
    text = "\n".join(page.read_text() for page in PAGES)
    paths = set(re.findall(r"(?<![\w/.])((?:example_project|bench|tests|\.ci)/[\w./]*)", text))
    assert {"example_project/manage.py", "tests/faults/test_volume.py"} <= paths
    assert [path for path in sorted(paths) if not (ROOT / path.rstrip(".")).exists()] == []


def _shipped_files() -> list[Path]:
    files = [*PAGES, ROOT / "CHANGELOG.md", ROOT / "pyproject.toml", ROOT / "mkdocs.yml"]
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
