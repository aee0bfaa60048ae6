"""The package's prose rules: short module docstrings, no dates in code, no function body
over 100 lines, and no stale names in the C files' comments.

The figures come from ``scripts/prose_counts.py`` (imported by path), so what the test
holds and what the script prints agree.
"""

from __future__ import annotations

import importlib.util
import sys

from .helpers import ROOT


def _counts():
    """The module ``scripts/prose_counts.py``."""
    name = "prose_counts"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "prose_counts.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and typing look the module up by name
        spec.loader.exec_module(module)
    return sys.modules[name]


counts = _counts()

#: The rules' limits.
MEDIAN_WORDS = 60
MOST_WORDS = 200
MOST_BODY_LINES = 100


def test_module_docstrings_are_short():
    words = counts.docstring_words(ROOT)
    missing = sorted(m for m, n in words.items() if n is None)
    assert not missing, f"modules without a docstring: {missing}"
    median = counts.docstring_median(words)
    assert median <= MEDIAN_WORDS, (
        f"median module docstring is {median} words (at most {MEDIAN_WORDS})"
    )
    long = sorted((n, m) for m, n in words.items() if n > MOST_WORDS)
    assert not long, f"module docstrings over {MOST_WORDS} words (words, module): {long}"


def test_no_dates_in_code():
    dates = counts.dates_in_code(ROOT)
    assert not dates, (
        "dates in the package's code (where and when a figure was measured belongs in "
        f"docs/performance.md): {dates}"
    )


def test_function_bodies_are_short():
    # Fails until commands/launch/cli.py's add_commands and run_main and report/stats.py's
    # summarize are split (issue 51, other parts of the work).
    long = [(n, where) for n, where in counts.function_bodies(ROOT) if n > MOST_BODY_LINES]
    assert not long, (
        f"function bodies over {MOST_BODY_LINES} lines (lines, module:function:line): {long}"
    )


def test_c_comments_name_what_exists():
    stale = counts.stale_c_names(ROOT)
    assert not stale, (
        f"names in the C files' comments that resolve to nothing in the package: {stale}"
    )


def test_the_checks_see_what_they_look_for(tmp_path):
    """The counters find what they should on a small made-up tree (so a passing rule is not
    a blind one)."""
    pkg = tmp_path / "instrumented_convs"
    native = pkg / "core" / "native"
    native.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""' + "word " * 250 + '"""\n# measured 2026-11-26\n')
    (pkg / "core" / "__init__.py").write_text('"""Short."""\n')
    (pkg / "core" / "clock.py").write_text(
        '"""A clock."""\n\n\ndef now():\n    """The time."""\n'
        + "    x = 1\n" * 101
        + "\n\ncpu_now = now\n"
    )
    (native / "__init__.py").write_text('"""Native."""\n')
    (native / "_speedups.c").write_text(
        "/* See clock.now and clock.cpu_now, _clock.on_set, old.py and clock.gone. */\n"
        'static PyMethodDef m[] = {{"bind", bind, METH_O, "Bind (see _stepbase)."}};\n'
    )
    words = counts.docstring_words(tmp_path)
    assert words["instrumented_convs"] == 250 and words["instrumented_convs.core.clock"] == 2
    assert [d for _, _, d in counts.dates_in_code(tmp_path)] == ["2026-11-26"]
    assert counts.function_bodies(tmp_path)[0] == (101, "instrumented_convs.core.clock:now:4")
    stale = [ref for _, _, ref in counts.stale_c_names(tmp_path)]
    assert stale == ["_clock.on_set", "old.py", "clock.gone", "_stepbase"]
