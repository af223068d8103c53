"""MkDocs hook: the benchmark's chart, kept where ``bench/run.py`` writes it.

``docs/speed.md`` shows ``../bench/results.png``, the path that is right on
GitHub, outside the docs directory MkDocs builds from. This hook adds the
file to the site as ``bench/results.png`` and points the page there, so that
the strict build checks that the chart exists instead of warning about it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent
CHART = "bench/results.png"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, CHART, abs_src_path=str(ROOT / CHART)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return markdown.replace(f"](../{CHART})", f"]({CHART})")
