"""Each number of a summary's rows worked out by hand from a snapshot (report/stats.py): the
spread of calls, the time of calls counted but not timed, a stratum's weight and standard
error, counters and unknown ops, rows by step, layer and relation, ranks merged."""

from __future__ import annotations

import math

import pytest

from instrumented_convs.report.stats import check_by, merge_ranks, summarize

from .helpers import entry_stats as entry

NS = 1e-9


def _ns(x: float):
    return pytest.approx(x * NS, rel=1e-12, abs=0)


def test_the_spread_of_calls_is_the_sample_standard_deviation_and_none_under_two_calls():
    s = summarize([
        entry("two", "two", None, 0, -1, 100, 300),  # (100² + 300² - 400²/2) / 1 = 20000 ns²
        entry("one", "one", None, 0, -1, 500),
        entry("same", "same", None, 0, -1, 50, 50, 50),  # 0 exactly: not below, not above
    ])  # fmt: skip
    two = s["two"]
    assert two.std == _ns(math.sqrt(20_000))
    assert (two.mean, two.min, two.max) == (_ns(200), _ns(100), _ns(300))
    assert s["one"].std == 0.0 and s["same"].std == 0.0


def test_calls_counted_but_not_timed_are_given_the_mean_of_the_timed_ones():
    s = summarize([
        # calls timed at random: the skipped ones at their mean, 80 / 2
        entry("r", "r", None, 0, -1, 10, 40, 40, skipped=3, rcount=2, rtotal=80),
        # none at random yet: at the mean of every timed call, 30 / 2
        entry("m", "m", None, 0, -1, 10, 20, skipped=3),
        # none timed: nothing to estimate from
        entry("n", "n", None, 0, -1, skipped=2),
        entry("one of each", "one of each", None, 0, -1, 10, skipped=1),
    ])  # fmt: skip
    assert (s["r"].count, s["r"].estimated, s["r"].total) == (6, 3, _ns(90 + 3 * 40))
    assert (s["m"].count, s["m"].total, s["m"].mean) == (5, _ns(30 + 3 * 15), _ns(15))
    assert (s["n"].count, s["n"].total, s["n"].min) == (2, 0.0, 0.0)
    assert (s["one of each"].count, s["one of each"].total) == (2, _ns(20))


def test_a_sampled_entry_stands_for_weight_times_its_calls_with_its_standard_error():
    s = summarize([
        entry("a", "a", None, 0, -1, 10, 30, skipped=1, weight=4.0, flops=5, dcalls=3, caught=2,
              host=7, lag=5, busy=9, unknown="aten::mm:3;aten::mm:1;x:2"),
        entry("b", "b", None, 0, -1, 10, 30, weight=2.0),
        entry("c", "c", None, 0, -1, 10, 30),
    ])  # fmt: skip
    a, b, c = s["a"], s["b"], s["c"]
    # a: 3 calls recorded (one skipped, at the mean 20), each standing for 4
    assert (a.count, a.sampled, a.total, a.mean) == (12, 3, _ns(4 * 60), _ns(20))
    # the variance of the scaled total: w²(1 - 1/w) calls s², s² = (10² + 30² - 40²/2) / 1
    assert a.se == _ns(math.sqrt(4 * 4 * (1 - 1 / 4) * 3 * 200))
    assert (b.count, b.sampled, b.se) == (4, 2, _ns(math.sqrt(2 * 2 * (1 - 1 / 2) * 2 * 200)))
    assert (c.count, c.sampled, c.se) == (2, 0, 0.0)
    assert (a.flops, a.device_calls, a.caught) == (20, 12, 8)
    assert (a.host, a.lag, a.busy) == (_ns(28), _ns(20), _ns(36))
    assert a.unknown == "aten::mm:16;x:8"


def test_under_the_eager_breakdown_nothing_is_scaled_and_the_summary_keeps_what_it_was_given():
    sampling = {"eager": {"available": True}, "every": 4}
    compiled = {"calls": 9}
    s = summarize(
        [entry("a", "a", None, 0, -1, 10, 30, weight=4.0)], sampling=sampling, compiled=compiled
    )
    assert (s["a"].count, s["a"].total, s["a"].sampled) == (2, _ns(40), 0)
    assert (s.sampling, s.compiled, s.total) == (sampling, compiled, _ns(40))


def test_the_tools_own_row_comes_last_outside_the_grand_total():
    s = summarize([
        entry("setup", "setup", None, 0, -1, 1000, kind="tool"),
        entry("a", "a", None, 0, -1, 100),
        entry("b", "b", None, 0, -1, 300),
    ])  # fmt: skip
    assert [r.name for r in s] == ["a", "b", "setup"]
    assert (s.total, s["a"].fraction, s["b"].fraction) == (_ns(400), 0.25, 0.75)


SCOPED = [
    entry("conv", "conv", "c0", 0, -1, 10, 20, relation="a__to__b"),
    entry("lin", "conv/lin", "c0", 1, 0, 4, relation="a__to__b"),
    entry("conv", "conv", "c1", 0, -1, untimed=2, relation="b__to__a"),
    entry("conv", "conv", "c2", 0, -1, 30, relation="a__to__b"),
]


@pytest.mark.parametrize(
    "by,rows",
    [
        ("step", [("conv", None, None, 3, 10), ("conv/lin", None, None, 1, 4)]),
        ("layer", [("conv", "c0", "a__to__b", 2, 10), ("conv/lin", "c0", "a__to__b", 1, 4),
                   ("conv", "c1", "b__to__a", 0, 0), ("conv", "c2", "a__to__b", 1, 30)]),
        ("relation", [("conv", None, "a__to__b", 3, 10), ("conv/lin", None, "a__to__b", 1, 4),
                      ("conv", None, "b__to__a", 0, 0)]),
    ],
)  # fmt: skip
def test_rows_by_step_layer_and_relation_carry_the_scope_and_relation_they_group(by, rows):
    """(c1's calls were all untimed: its shortest call is no one's, and merges as none.)"""
    s = summarize(SCOPED, by=by)
    assert [(r.name, r.scope, r.relation, r.count, round(r.min / NS)) for r in s] == rows


def test_an_unknown_grouping_is_refused_by_name():
    with pytest.raises(ValueError, match="by must be 'step', 'layer' or 'relation', not 'rank'"):
        check_by("rank")


def test_ranks_merge_in_rank_order_with_the_slowest_and_fastest_rank_of_each_row():
    """Rank 1's entries point to their parents in its own snapshot (index 0 too); a tie for
    the slowest goes to the lowest rank. The sampling given is applied rank by rank (here
    the eager breakdown: nothing scaled) and kept, with the unit, grouping and what ran
    compiled, by the merged summary and each rank's part."""
    rank0 = [entry("a", "a", None, 0, -1, 100, weight=2.0), entry("x", "a/x", None, 1, 0, 40)]
    rank1 = [
        entry("b", "b", None, 0, -1, 50),
        entry("y", "b/y", None, 1, 0, 20),
        entry("a", "a", None, 0, -1, 100, weight=2.0),
    ]
    sampling, compiled = {"eager": {"available": True}}, {"calls": 3}
    merged = merge_ranks(
        [rank0, rank1], by="layer", unit="ms", sampling=sampling, compiled=compiled
    )
    got = [(r.name, r.count, r.ranks, r.slowest_rank, r.slowest, r.fastest) for r in merged]
    assert got == [
        ("a", 2, 2, 0, _ns(100), _ns(100)),
        ("a/x", 1, 1, 0, _ns(40), _ns(40)),
        ("b", 1, 1, 1, _ns(50), _ns(50)),
        ("b/y", 1, 1, 1, _ns(20), _ns(20)),
    ]
    assert (merged.unit, merged.by, merged.over) == ("ms", "layer", "ranks")
    assert (merged.sampling, merged.compiled, merged.total) == (sampling, compiled, _ns(250))
    parts = merged.by_rank()
    assert [(p.unit, p.by, p.sampling) for p in parts] == [("ms", "layer", sampling)] * 2
    assert [p.total for p in parts] == [_ns(100), _ns(150)]
    assert [[(r.name, r.count, r.rank) for r in p] for p in parts] == [
        [("a", 1, 0), ("a/x", 1, 0)],
        [("b", 1, 1), ("b/y", 1, 1), ("a", 1, 1)],
    ]
