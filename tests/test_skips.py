"""CI's check of skips (tests/skips.py): a skip its environment does not list fails the run and
is named; a listed one, or a run by hand (no label), passes."""

from __future__ import annotations

import os
import subprocess
import sys

from .helpers import ROOT
from .skips import unexpected

TESTS = """\
import pytest

def test_no_gpu():
    pytest.skip("needs a CUDA GPU")

def test_other():
    pytest.skip("something else")

def test_runs():
    pass
"""


def _pytest(tmp_path, **env):
    folder = tmp_path / "tests"
    folder.mkdir(exist_ok=True)
    (folder / "test_x.py").write_text(TESTS)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("INSTRUMENTED_CONVS_SKIPS")}
    environ.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.skips",
         "tests/test_x.py"],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_skip_its_environment_does_not_list_fails_the_run_and_is_named(tmp_path):
    proc = _pytest(tmp_path, INSTRUMENTED_CONVS_SKIPS="main")
    assert proc.returncode == 1, proc.stdout
    assert "skips not expected in main" in proc.stdout
    assert "tests/test_x.py: something else  [tests/test_x.py::test_other]" in proc.stdout
    assert "needs a CUDA GPU  [" not in proc.stdout  # listed for main


def test_a_run_by_hand_or_a_report_is_not_failed_for_its_skips(tmp_path):
    assert _pytest(tmp_path).returncode == 0
    report = _pytest(tmp_path, INSTRUMENTED_CONVS_SKIPS="main", INSTRUMENTED_CONVS_SKIPS_REPORT="1")
    assert report.returncode == 0 and "something else  [" in report.stdout


def test_an_environment_without_a_list_fails_and_says_so(tmp_path):
    proc = _pytest(tmp_path, INSTRUMENTED_CONVS_SKIPS="nowhere")
    assert proc.returncode == 1
    assert "INSTRUMENTED_CONVS_SKIPS=nowhere: tests/expected_skips.py has no list for it" in (
        proc.stdout
    )


def test_a_reason_must_match_whole():
    seen = [("a", "tests/test_x.py: needs a CUDA GPU"), ("b", "tests/test_x.py: needs a CUDA GPU!")]
    assert unexpected("main", seen) == [seen[1]]
    assert unexpected("nowhere", seen) == seen
