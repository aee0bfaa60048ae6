"""``Summary.diff`` and ``python -m instrumented_convs diff``: pairing, verdicts, exit codes.

The verdicts are checked on rows with chosen means, spreads and counts, where the right
answer is known by hand, and on two saved runs through the command line.
"""

from __future__ import annotations

import math

import pytest

import instrumented_convs as ic
from instrumented_convs.commands.cli import main as cli_main
from instrumented_convs.commands.launch.runs import write_run
from instrumented_convs.report import Summary, SummaryDiff

from .fakes import row


def verdicts(a, b, **kw):
    return {(d.name, d.phase): d.verdict for d in Summary(a).diff(Summary(b), **kw)}


def test_a_clear_change_either_way_and_a_clear_non_change():
    a = [row("f", 1.0, 0.01), row("f/g", 0.5, 0.01), row("f/h", 0.2, 0.01)]
    b = [row("f", 1.2, 0.01), row("f/g", 0.4, 0.01), row("f/h", 0.201, 0.01)]
    assert verdicts(a, b) == {
        ("f", "forward"): "slower",
        ("f/g", "forward"): "faster",
        ("f/h", "forward"): "unchanged",
    }
    d = Summary(a).diff(Summary(b))
    first = next(iter(d))
    assert math.isclose(first.change, 0.2) and math.isclose(first.relative, 0.2)
    assert math.isclose(first.error, math.sqrt(2 * 0.01**2 / 100))
    assert [r.name for r in d.worse_than(0.1)] == ["f"] and d.worse_than(0.25) == []


def test_too_noisy_when_the_spread_or_the_calls_cannot_tell():
    a = [row("wide", 1.0, 2.0), row("few", 1.0, 0.0, count=1), row("small", 1.0, 0.01)]
    b = [row("wide", 1.3, 2.0), row("few", 2.0, 0.0, count=1), row("small", 1.03, 0.5)]
    assert set(verdicts(a, b).values()) == {"too noisy"}
    # a real 3% change, under min_change (5%): unchanged for this purpose; at 2% it counts
    assert verdicts([row("s", 1.0, 0.001)], [row("s", 1.03, 0.001)])[("s", "forward")] == (
        "unchanged"
    )
    assert (
        verdicts([row("s", 1.0, 0.001)], [row("s", 1.03, 0.001)], min_change=0.02)[("s", "forward")]
        == "slower"
    )


def test_added_missing_untimed_and_the_tree_order_kept():
    a = [row("f", 1.0), row("f/g", 0.5), row("f/g", 0.1, phase="backward"), row("u", 1.0)]
    b = [row("f", 1.0), row("f/new", 0.2), row("f/g", 0.5), row("u", 1.0, count=5, estimated=5)]
    d = list(Summary(a).diff(Summary(b)))
    assert [(x.name, x.phase, x.verdict) for x in d] == [
        ("f", "forward", "unchanged"),
        ("f/new", "forward", "added"),
        ("f/g", "forward", "unchanged"),
        ("f/g", "backward", "missing"),
        ("u", "forward", "untimed"),
    ]
    text = str(Summary(a).diff(Summary(b)))
    assert "- new" in text and "g [backward]" in text and "added: 1" in text


def test_by_step_and_by_layer_do_not_mix():
    with pytest.raises(ValueError, match="by 'step'"):
        Summary([row("f", 1.0)]).diff(Summary([row("f", 1.0, scope="x")], by="layer"))


def _run(folder, seconds):
    ic.registry.reset()
    for s in seconds:
        ic.registry.add("epoch", s)
    write_run(folder, ic.registry.snapshot(), {"exit_code": 0})
    ic.registry.reset()


def test_the_command_line_and_its_exit_code_for_ci(tmp_path, capsys):
    _run(tmp_path / "a", [0.010, 0.0101, 0.0099] * 10)
    _run(tmp_path / "b", [0.012, 0.0121, 0.0119] * 10)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert cli_main(["diff", a, b]) == 0
    out = capsys.readouterr().out
    assert "slower" in out and "+20.0%" in out
    assert cli_main(["diff", a, b, "--fail-above", "5"]) == 1
    assert cli_main(["diff", a, b, "--fail-above", "25"]) == 0
    assert cli_main(["diff", b, a, "--fail-above", "5"]) == 0  # faster never fails


def test_a_diff_made_from_its_rows_alone_renders_the_same_page():
    a = [row("f", 1.0, 0.01), row("f/g", 0.5, 0.01), row("f/gone", 0.1, 0.01)]
    b = [row("f", 1.2, 0.01), row("f/g", 0.4, 0.01), row("f/h", 0.2, 0.01)]
    full = Summary(a).diff(Summary(b))
    bare = SummaryDiff(full.rows, full.min_change)  # no summaries: both runs from the pairs
    assert bare.a is None and bare.b is None
    assert bare.to_html(labels=("x", "y")) == full.to_html(labels=("x", "y"))
