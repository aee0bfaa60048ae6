"""Skips that CI expects, and a failure for any other (issue 69).

Each pytest run of scripts/test.sh and scripts/test_beside.sh names its environment in
``INSTRUMENTED_CONVS_SKIPS`` (``main``, ``pure``, ``integrations``, ``pyg-matrix``, ``dgl2``,
``sparse``); a test skipped there for a reason that :data:`tests.expected_skips.EXPECTED` does
not list for that environment fails the run, named with its reason. Without the variable
(a run by hand) nothing is checked. ``INSTRUMENTED_CONVS_SKIPS_REPORT=1`` lists the skips not
expected without failing (to write the list).
"""

from __future__ import annotations

import os
import re
from typing import List, Tuple

import pytest

from .expected_skips import EXPECTED

#: The variable that names the environment, and the one that reports without failing.
LABEL, REPORT = "INSTRUMENTED_CONVS_SKIPS", "INSTRUMENTED_CONVS_SKIPS_REPORT"

_seen: List[Tuple[str, str]] = []  # (the test or file, "path: reason")


def reason_of(report: pytest.CollectReport | pytest.TestReport) -> str:
    """A skip's ``path: reason`` as ``-rs`` shows it, without the line number."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, _, reason = longrepr
        return f"{os.path.relpath(str(path)) if os.path.isabs(str(path)) else path}: " + (
            reason[len("Skipped: ") :] if reason.startswith("Skipped: ") else reason
        )
    return str(longrepr)


def unexpected(label: str, seen: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """The skips of ``seen`` that :data:`EXPECTED` does not list for ``label`` (all, where
    it has no list for it)."""
    patterns = [re.compile(p) for p in EXPECTED.get(label, ())]
    return [(who, why) for who, why in seen if not any(p.fullmatch(why) for p in patterns)]


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module skipped as a whole (``importorskip`` at its top)."""
    if report.skipped:
        _seen.append((report.nodeid, reason_of(report)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test skipped at setup or in its body (not an expected failure, ``xfail``)."""
    if report.skipped and not hasattr(report, "wasxfail"):
        _seen.append((report.nodeid, reason_of(report)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run where a skip was not expected in the environment it names."""
    label = os.environ.get(LABEL)
    if not label:
        return
    bad = unexpected(label, _seen)
    if label not in EXPECTED:
        bad = [("", f"{LABEL}={label}: tests/expected_skips.py has no list for it")] + bad
    if not bad:
        return
    writer = session.config.get_terminal_writer()
    writer.line()
    writer.line(f"skips not expected in {label} (tests/expected_skips.py):", red=True)
    for who, why in bad:
        writer.line(f"  {why}  [{who}]")
    if os.environ.get(REPORT) != "1" and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
