"""The rendered table (golden files), unit choice and the JSON/CSV/DataFrame round trips."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from instrumented_convs import region, registry
from instrumented_convs.layers import step
from instrumented_convs.report import Summary, choose_unit
from instrumented_convs.report.stats import EntryStats, summarize

GOLDEN = Path(__file__).parent / "golden"
MS = 1_000_000  # ns


def _seed_like_run(clock):
    """The study's epoch phases, with a 3-layer GCN's steps inside forward (exact times)."""
    for _ in range(4):
        with region("forward"):
            for layer in range(3):
                with step("GCNConv", scope=f"convs.{layer}"):
                    with step("gcn_norm"):
                        clock.advance(1 * MS)
                        with step("add_remaining_self_loops"):
                            clock.advance(6 * MS + layer * MS)
                    with step("lin"):
                        clock.advance(1 * MS)
                    with step("propagate"):
                        with step("message_and_aggregate"):
                            clock.advance(12 * MS)
                        clock.advance(MS // 10)
                    with step("bias"):
                        clock.advance(MS // 2)
        with region("loss"):
            clock.advance(2 * MS)
        with region("backward"):
            clock.advance(27 * MS)
        with region("optimizer.step"):
            clock.advance(1 * MS)


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text + "\n")
    assert text + "\n" == path.read_text(), (
        f"rendering changed; if intended, rerun with UPDATE_GOLDEN=1 and review {path}"
    )


def test_table_matches_golden_file(clock):
    _seed_like_run(clock)
    _check_golden("summary_by_step.txt", str(registry.summary()))


def test_layer_table_matches_golden_file(clock):
    _seed_like_run(clock)
    _check_golden(
        "summary_by_layer.txt", str(registry.summary(by="layer").select("forward", max_depth=2))
    )


def test_table_states_its_unit_and_can_be_forced(clock):
    _seed_like_run(clock)
    s = registry.summary()
    assert "(times in ms)" in str(s).splitlines()[0]
    assert "(times in s)" in s.table(unit="s").splitlines()[0]
    assert "(times in us)" in str(registry.summary(unit="us")).splitlines()[0]
    with pytest.raises(ValueError):
        registry.summary(unit="minutes")


@pytest.mark.parametrize(
    "values, unit",
    [
        ([2.0, 0.001], "s"),
        ([0.0591, 0.0005], "ms"),
        ([3e-6], "us"),
        ([5e-9], "ns"),
        ([], "ns"),
        ([0.0], "ns"),
    ],
)
def test_choose_unit(values, unit):
    assert choose_unit(values)[0] == unit


def test_epoch_level_table_reproduces_the_seed_columns(clock):
    _seed_like_run(clock)
    top = registry.summary().select(max_depth=0)
    assert [r.name for r in top] == ["forward", "loss", "backward", "optimizer.step"]
    assert sum(r.fraction for r in top) == pytest.approx(1.0)
    header = str(top).splitlines()[1]
    for col in ("Event", "Count", "Average", "Frac."):
        assert col in header


def test_json_round_trip(clock):
    _seed_like_run(clock)
    for by in ("step", "layer"):
        s = registry.summary(by=by)
        back = Summary.from_json(s.to_json())
        assert back == s and back.rows == s.rows
        assert str(back) == str(s)


def test_csv_round_trip(clock):
    _seed_like_run(clock)
    s = registry.summary(by="layer")
    text = s.to_csv()
    assert text.splitlines()[0].startswith("name,step,depth,scope,kind,count,total,self_time,mean")
    back = Summary.from_csv(text, by="layer")
    assert back.rows == s.rows


def test_dataframe_round_trip(clock):
    pd = pytest.importorskip("pandas")
    _seed_like_run(clock)
    for by in ("step", "layer"):
        s = registry.summary(by=by)
        df = s.to_dataframe()
        assert isinstance(df, pd.DataFrame)
        assert list(df["name"]) == [r.name for r in s]
        assert df.loc[df["name"] == "forward", "count"].iloc[0] == 4
        assert Summary.from_dataframe(df, by=by).rows == s.rows


def test_summary_access_helpers(clock):
    _seed_like_run(clock)
    s = registry.summary()
    assert "forward/GCNConv/lin" in s and "nope" not in s
    assert [r.name for r in s.find("lin")] == ["forward/GCNConv/lin"]
    with pytest.raises(KeyError):
        s["nope"]
    assert len(s) == len(s.rows) and list(s) == s.rows
    assert "rows" in repr(s)


def _stats(name, path, scope, depth, parent, *times, kind="step"):
    return EntryStats(
        name,
        path,
        scope,
        kind,
        depth,
        parent,
        len(times),
        sum(times),
        sum(t * t for t in times),
        min(times, default=0),
        max(times, default=0),
        0,
        0,
    )


def test_summary_arithmetic_works_on_plain_data_alone():
    snapshot = [
        _stats("fwd", "fwd", None, 0, -1, 100, 300, kind="region"),
        _stats("conv", "fwd/conv", "c0", 1, 0, 50, 70),
        _stats("lin", "fwd/conv/lin", "c0", 2, 1, 20, 40),
        _stats("conv", "fwd/conv", "c1", 1, 0, 30),
        _stats("loss", "loss", None, 0, -1, 100),
    ]
    s = summarize(snapshot)
    assert [r.name for r in s] == ["fwd", "fwd/conv", "fwd/conv/lin", "loss"]
    assert s.total == pytest.approx(500e-9)
    conv = s["fwd/conv"]
    assert (conv.count, conv.total, conv.self_time) == (
        3,
        pytest.approx(150e-9),
        pytest.approx(90e-9),
    )
    assert (conv.min, conv.max) == (pytest.approx(30e-9), pytest.approx(70e-9))
    assert conv.std == pytest.approx(20e-9)  # 50, 70, 30: mean 50, sample variance 400
    assert s["fwd"].self_fraction == pytest.approx(250 / 500)
    assert sum(r.self_fraction for r in s) == pytest.approx(1.0)
    by_layer = summarize(snapshot, by="layer")
    assert [(r.scope, r.name, r.count) for r in by_layer] == [
        (None, "fwd", 2),
        ("c0", "fwd/conv", 2),
        ("c0", "fwd/conv/lin", 2),
        ("c1", "fwd/conv", 1),
        (None, "loss", 1),
    ]
    with pytest.raises(ValueError):
        summarize(snapshot, by="scope")


def test_registry_summary_is_the_arithmetic_of_its_snapshot(clock):
    _seed_like_run(clock)
    snap = registry.snapshot()
    assert all(isinstance(e, EntryStats) for e in snap)
    assert snap[0].path == "forward" and snap[0].parent == -1
    assert snap[snap[1].parent].path == "forward" and snap[1].path == "forward/GCNConv"
    for by in ("step", "layer"):
        assert registry.summary(by=by) == summarize(snap, by=by)


def test_a_column_added_to_the_spec_alone_shows_in_the_table_the_page_and_the_exports(clock):
    """A new column is one entry of report.columns: the text table, the page (its script
    draws the headers and cells the data holds) and JSON, CSV and pandas find it."""
    import json
    import re

    from instrumented_convs.report import Column, columns

    _seed_like_run(clock)
    calls_per_s = Column("calls_per_s", "Calls/s", value=lambda r: r.count / r.total)
    columns.add(calls_per_s, before="fraction")
    try:
        s = registry.summary()
        table = str(s)
        header = table.splitlines()[1]
        assert header.index("Calls/s") < header.index("Frac.")
        lin = s["forward/GCNConv/lin"]  # 12 calls of 1 ms: 1000 calls a second
        assert [line for line in table.splitlines() if "- lin" in line][0].split("|")[
            -2
        ].strip() == "1000"
        page = s.render("page")
        data = json.loads(
            re.search(
                r'<script type="application/json" id="data">(.*?)</script>', page, re.S
            ).group(1)
        )
        run = data["runs"][0]
        k = run["columns"].index("Calls/s")
        assert run["cells"][[r["name"] for r in run["rows"]].index(lin.name)][k] == "1000"
        rows = json.loads(s.render("json"))["rows"]
        assert [r["calls_per_s"] for r in rows if r["name"] == lin.name] == [1000.0]
        assert "calls_per_s" in s.render("csv").splitlines()[0]
        assert "calls_per_s" in s.to_dataframe().columns
        # and the summary reads back without it (it is no field of Row)
        assert Summary.from_json(s.to_json()) == s
        assert Summary.from_csv(s.to_csv()).rows == s.rows
    finally:
        columns.remove("calls_per_s")
    assert "Calls/s" not in str(registry.summary())


def test_the_page_shows_times_in_the_unit_the_table_chose(clock):
    """One unit, the text table's: the page's columns say it and hold the same cells."""
    import json
    import re

    with step("tiny"):
        clock.advance(13_700)  # 13.7 us: the table reads 13.700 us, not 0.0000137 s
    s = registry.summary()
    assert "(times in us)" in str(s) and "13.700" in str(s)
    data = json.loads(re.search(r'id="data">(.*?)</script>', s.render("page"), re.S).group(1))
    run = data["runs"][0]
    assert run["unit"] == "us" and "Average (us)" in run["columns"]
    assert run["cells"][0][run["columns"].index("Average (us)")] == "13.700"


def test_every_renderer_by_name_and_a_run_folder_written_by_each(clock, tmp_path):
    from instrumented_convs.report import RENDERERS, RenderInput, Run, render, write_folder

    _seed_like_run(clock)
    s = registry.summary()
    assert set(RENDERERS) == {
        *("text", "page", "json", "csv", "roofline", "memory", "trace", "workers", "advice")
    }
    assert Run is RenderInput  # the name it had
    assert render("text", Run(s)) == str(s) == s.render()
    # the summary's exports go through the renderers, and say what the formats say
    from instrumented_convs.report import TableRenderer, memory, page, roofline

    table = TableRenderer(unit="us", title="T", spread=False).render(s)
    assert (
        s.table(unit="us", title="T", spread=False)
        == table
        == render("text", RenderInput(s, options={"unit": "us", "title": "T", "spread": False}))
    )
    assert s.to_json(indent=None) == render("json", RenderInput(s, options={"indent": None}))
    assert s.table(counters=True) == roofline.render(s, None, s.unit) == render("roofline", Run(s))
    assert s.table(memory=True) == memory.render(s) == render("memory", RenderInput(s))
    html = page.summary_page(s, "t", note="n")
    assert s.to_html(title="t", note="n") == html == render("page", Run(s, title="t", note="n"))
    assert render("json", Run(s)) == s.to_json() and render("csv", Run(s)) == s.to_csv()
    assert render("page", Run(s, title="t")).startswith("<!DOCTYPE html>")
    with pytest.raises(ValueError, match="no renderer 'pdf'"):
        render("pdf", Run(s))
    written = write_folder(tmp_path, Run(s, title="a run"))
    # a summary without counters or a timeline: the table and the page only
    assert sorted(p.name for p in written) == ["page.html", "summary.txt"]
    assert (tmp_path / "summary.txt").read_text() == str(s) + "\n"
