"""A statistic of a summary is one place (report/stats.py's STATISTICS), and the table's
footnotes are the docs of the columns it shows (report/columns.py)."""

from __future__ import annotations

import dataclasses
from operator import attrgetter

import pytest

from instrumented_convs.report import Summary, columns, stats
from instrumented_convs.report.stats import merge_ranks, summarize

from .helpers import entry_stats

SNAPSHOT = [
    entry_stats("fwd", "fwd", None, 0, -1, 100, 300),
    entry_stats("conv", "fwd/conv", "c0", 1, 0, 50, 70),
    entry_stats("lin", "fwd/conv/lin", "c0", 2, 1, 20, 40, 10),
    entry_stats("conv", "fwd/conv", "c1", 1, 0, 30),
    entry_stats("loss", "loss", None, 0, -1, 100),
]


@pytest.fixture
def calls_in():
    """A statistic and its column, added for the test and taken out after: a step's timed
    calls with its descendants' (merged as a sum), in the table before Frac."""
    statistic = stats.add(stats.Statistic("calls_in", attrgetter("count"), "add"))
    column = columns.add(
        columns.Column(
            "calls_in", "Calls in", "count", doc="timed calls, its children's in.", note=True
        ),
        before="fraction",
    )
    yield statistic, column
    stats.remove("calls_in")
    columns.remove("calls_in")


def test_a_statistic_added_in_one_place_is_in_the_rows_and_with_its_column_in_the_table(
    calls_in,
):
    s = summarize(SNAPSHOT)
    got = {r.name: r.calls_in for r in s}
    assert got == {"fwd": 8, "fwd/conv": 6, "fwd/conv/lin": 3, "loss": 1}
    assert s["fwd/conv"].extra == {"calls_in": 6}  # no Row field: kept beside them
    assert [r.calls_in for r in summarize(SNAPSHOT, by="layer")] == [8, 5, 3, 1, 1]

    table = str(s)
    header = table.splitlines()[1]
    assert header.split(" | ")[-2:] == ["Calls in", "Frac."]
    assert [line.split(" | ")[-2].strip() for line in table.splitlines()[2:6]] == [
        "8",
        "6",
        "3",
        "1",
    ]
    assert "Calls in: timed calls, its children's in." in table.splitlines()

    # merged over ranks: the same merge (a sum), and each rank's part has its own
    merged = merge_ranks([SNAPSHOT, SNAPSHOT])
    assert merged["fwd"].calls_in == 16
    assert [part["fwd"].calls_in for part in merged.by_rank()] == [8, 8]
    # JSON and CSV write it as the value of its column
    assert [r["calls_in"] for r in s.to_dict()["rows"]] == [8, 6, 3, 1]
    assert "calls_in" in s.to_csv().splitlines()[0].split(",")
    assert Summary.from_json(s.to_json())["fwd"].total == s["fwd"].total


def test_a_statistic_taken_out_is_no_longer_in_the_rows(calls_in):
    stats.remove("calls_in")
    try:
        row = summarize(SNAPSHOT)["fwd"]
        assert row.extra == {}
        with pytest.raises(AttributeError):
            row.calls_in
    finally:
        stats.add(calls_in[0])  # for the fixture to take out


def test_a_statistic_named_twice_or_that_summarize_could_not_apply_is_refused():
    with pytest.raises(ValueError, match="total"):
        stats.add(stats.Statistic("total", attrgetter("total")))
    with pytest.raises(KeyError, match="nothing"):
        stats.remove("nothing")
    with pytest.raises(ValueError, match="x: children is '', 'add' or 'less'"):
        stats.Statistic("x", attrgetter("total"), "most")
    for children in ("", "add", "less"):  # each taken
        assert stats.Statistic("x", attrgetter("total"), children).children == children
    with pytest.raises(ValueError, match="share"):
        stats.Statistic("x")


def test_a_statistic_merges_layer_instances_and_strata_as_it_says():
    # the largest of the entries merged into a row, weights (strata) not applied
    stats.add(stats.Statistic("most_errors", attrgetter("errors"), merge=max))
    try:
        snapshot = [
            entry_stats("a", "a", "x", 0, -1, 5, errors=2, weight=3.0),
            entry_stats("a", "a", "y", 0, -1, 5, errors=7),
        ]
        row = summarize(snapshot)["a"]
        assert (row.most_errors, row.errors, row.count) == (7, 9, 4)
    finally:
        stats.remove("most_errors")


def _footnotes(table: str):
    """The lines under a table's closing rule."""
    lines = table.splitlines()
    rule = max(i for i, line in enumerate(lines) if line and set(line) == {"-"})
    return lines[rule + 1 :]


def _expected(summary, spread=True, unit="ns", scale=1e-9):
    """The footnotes of the columns a table of ``summary`` shows, from their docs alone."""
    world = summary.world_size
    shown = columns.shown(world is not None, spread, memory=columns.recorded_memory(summary.rows))
    over = summary.over
    return columns.footnotes(
        shown,
        total=f"{summary.total / scale:.3f} {unit}",
        unit=unit,
        world=world,
        over=over,
        one=over[:-1],
    )


def test_the_footnotes_are_those_of_the_columns_docs():
    one = summarize(SNAPSHOT)
    frac = (
        "Frac.: share of the total of top-level steps (500.000 ns); a step's Frac. = its "
        "Self share + its children's Frac."
    )
    assert _footnotes(one.table()) == _expected(one) == [frac]
    merged = merge_ranks([SNAPSHOT, SNAPSHOT[:2]])
    assert _footnotes(merged.table()) == _expected(merged)
    assert _footnotes(merged.table())[1:] == [
        "Count, times and Frac. are over all 2 ranks: counts and totals summed, Min and Max "
        "over every rank's calls.",
        "Slowest: the largest total of one rank (r<rank>); Spread: slowest / fastest rank's "
        "total, over the ranks that ran the step (k/n: only k of n ranks did).",
    ]
    assert _footnotes(merged.table(spread=False)) == _expected(merged, spread=False)
    assert len(_footnotes(merged.table(spread=False))) == 2
    memory = summarize([SNAPSHOT[0]._replace(mem_calls=2, peak_bytes=4096, saved_bytes=512)])
    assert _footnotes(memory.table()) == _expected(memory)
    assert _footnotes(memory.table())[-1].startswith("Saved/call: bytes of the tensors")


def test_a_columns_doc_is_its_footnote_and_a_column_without_note_has_none():
    s = summarize(SNAPSHOT)
    count = columns.COLUMNS[0]
    assert count.doc and not count.note and count.doc not in str(s)
    keys = [c.key for c in columns.COLUMNS]
    frac = columns.remove("fraction")
    columns.add(
        dataclasses.replace(frac, doc="of {total}, in {unit}: see the docs"),
        before=keys[keys.index("fraction") + 1],
    )
    try:
        assert _footnotes(str(s)) == ["Frac.: of 500.000 ns, in ns: see the docs"]
    finally:
        columns.remove("fraction")
        columns.add(frac, before=keys[keys.index("fraction") + 1])
    assert [c.key for c in columns.COLUMNS] == keys
