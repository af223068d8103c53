"""Check the built distributions in dist/: what a user installs must be complete.

The wheel must carry py.typed, every module of the backends packages, every
migration, every template under django_tasklock/templates (the admin page's)
and the LICENSE; the sdist must carry the LICENSE and README. Run by .ci/run after
``python -m build``.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_tasklock"


def shipped(directory: str) -> set[str]:
    """The package's files under ``directory`` in the source tree, as wheel paths."""
    base = PACKAGE / directory
    return {
        path.relative_to(ROOT).as_posix()
        for path in base.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def main() -> int:
    wheels = sorted((ROOT / "dist").glob("*.whl"))
    sdists = sorted((ROOT / "dist").glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"expected one wheel and one sdist in dist/, found {wheels + sdists}")
        return 1
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    expected = {"django_tasklock/py.typed"} | shipped("migrations") | shipped("templates")
    expected |= {name for name in shipped("backends") if name.endswith(".py")}
    problems = [f"wheel lacks {name}" for name in sorted(expected - names)]
    if not any(name.endswith(".dist-info/licenses/LICENSE") for name in names):
        problems.append("wheel lacks its LICENSE")
    with tarfile.open(sdists[0]) as sdist:
        members = {name.split("/", 1)[-1] for name in sdist.getnames()}
    problems += [f"sdist lacks {name}" for name in ("LICENSE", "README.md") if name not in members]
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{wheels[0].name}: {len(expected)} required files present; sdist complete")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
