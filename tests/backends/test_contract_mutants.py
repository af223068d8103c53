"""The contract suite catches broken backends: every mutant fails, every control passes.

All subjects of ``tests/support/contract_mutants.py`` run in one child pytest (one
start-up, a few cases each); each test here reads one subject's outcome.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import require_service
from tests.support.contract_mutants import SUBJECTS
from tests.support.services import child_env

ROOT = Path(__file__).resolve().parents[2]
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--no-cov", "-q"]
PYTEST += ["-o", "junit_family=xunit1"]
MUTANTS = [name for name in SUBJECTS if not name.startswith(("Control", "Without"))]
CONTROLS = [name for name in SUBJECTS if name.startswith("Control")]

#: subject -> [(case, outcome, message)], outcome one of passed, failed, error, skipped.
Outcomes = dict[str, list[tuple[str, str, str]]]


def _wanted(name: str) -> bool:
    databases = SUBJECTS[name][2]
    return "postgres" not in databases or "postgres" in settings.DATABASES


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    report = tmp_path_factory.mktemp("mutants") / "report.xml"
    node_ids = [
        f"tests/support/contract_mutants.py::Test{name}::{case}"
        for name, (_, cases, _) in SUBJECTS.items()
        if _wanted(name)
        for case in cases
    ]
    child = subprocess.run(
        [*PYTEST, f"--junitxml={report}", *node_ids],
        cwd=ROOT,
        env={**child_env(), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert report.exists(), child.stdout[-3000:] + child.stderr[-3000:]
    found: Outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        subject = case.get("classname", "").rsplit(".Test", 1)[-1]
        outcome, message = "passed", ""
        for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                outcome, message = name, element.get("message", "")
        found.setdefault(subject, []).append((case.get("name", ""), outcome, message))
    return found


@pytest.mark.parametrize("name", MUTANTS)
def test_every_mutant_fails_a_contract_case(name: str, outcomes: Outcomes) -> None:
    if not _wanted(name):
        require_service("postgres")
    results = outcomes[name]
    # Failed by an assertion of the case, not by an error of the harness.
    assert any(outcome == "failed" for _, outcome, _ in results), results
    assert not any(outcome == "error" for _, outcome, _ in results), results


@pytest.mark.parametrize("name", CONTROLS)
def test_correct_backends_pass_the_same_cases(name: str, outcomes: Outcomes) -> None:
    results = outcomes[name]
    assert results
    assert all(outcome == "passed" for _, outcome, _ in results), results


def test_a_missing_hook_is_a_skip_with_its_reason(outcomes: Outcomes) -> None:
    results = {case: (outcome, message) for case, outcome, message in outcomes["WithoutHooks"]}
    assert results
    assert all(outcome == "skipped" for outcome, _ in results.values()), results
    assert all("hook" in message for _, message in results.values()), results
