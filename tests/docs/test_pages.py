"""Every page of the docs site opens the same way: a "paste this" block, then what it does.

Right after the title comes the smallest code or command that does what the
page is about (a ```python block, run alone by ``test_readme.py`` like every
other, or a ```sh block), then one paragraph saying what it does; the edge
cases come after. A page is read in five minutes when its first screen is
enough to use it. And every page is in the site's nav, the API reference
included.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LONGEST_OPENING_BLOCK = 30  # lines: short enough to read before scrolling


def opening(text: str) -> tuple[str, list[str], str]:
    """The first block's language and lines, and the first line after it."""
    lines = text.splitlines()
    assert lines[0].startswith("# "), "a page starts with its title"
    rest = lines[1:]
    i = 0
    while i < len(rest) and (not rest[i].strip() or re.match(r"<!--.*-->$", rest[i])):
        i += 1
    fence = re.match(r"```(\w*)$", rest[i]) if i < len(rest) else None
    assert fence, f"after the title comes a code block, not {rest[i] if i < len(rest) else ''!r}"
    end = rest.index("```", i + 1)
    after = next((line for line in rest[end + 1 :] if line.strip()), "")
    return fence.group(1), rest[i + 1 : end], after


@pytest.mark.parametrize("page", DOCS, ids=[page.name for page in DOCS])
def test_the_page_opens_with_a_paste_this_block_and_a_paragraph(page: Path) -> None:
    language, block, after = opening(page.read_text())
    assert language in {"python", "sh"}, "a block to paste: Python or a shell command"
    assert 0 < len(block) <= LONGEST_OPENING_BLOCK
    # A paragraph, not a heading, a list, a table, a quote or another block.
    assert re.match(r"[A-Za-z`\"'(\[*]", after), after
    assert not re.match(r"[-*] ", after), after


def test_the_opening_is_found() -> None:
    page = "# T\n\n<!-- docs-test: skip (x) -->\n```sh\nls\n```\n\nWhat it does.\n\n## More\n"
    assert opening(page) == ("sh", ["ls"], "What it does.")
    with pytest.raises(AssertionError):
        opening("# T\n\nProse first.\n\n```sh\nls\n```\n")


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    assert {page.name for page in DOCS} == set(re.findall(r"([\w.-]+\.md)$", nav, re.MULTILINE))


def test_alerts_are_kinds_the_site_styles_with_no_code_inside() -> None:
    # Material colours note, tip and warning; GitHub's IMPORTANT and CAUTION
    # would show as a plain note. A block inside "> " is not run by test_readme.
    for page in DOCS:
        text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
        kinds = re.findall(r"^> \[!(\w+)\]$", text, re.MULTILINE)
        assert set(kinds) <= {"NOTE", "TIP", "WARNING"}, page.name
        assert not re.search(r"^>\s*```", text, re.MULTILINE), page.name


def test_sphinx_roles_in_docstrings_read_as_code_in_the_api_reference() -> None:
    pytest.importorskip("griffe")  # the docs extra
    from docs_hooks import sphinx_roles_as_code  # the repository's root is on the path

    text = "A :class:`~django_tasklock.locking.lock.Lock`; :meth:`Lock.release` ``await``\\ ed::"
    assert sphinx_roles_as_code(text) == (
        "A <code>Lock</code>; <code>Lock.release</code> ``await``ed:"
    )
