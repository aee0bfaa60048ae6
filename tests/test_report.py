"""The rendered table (golden files), unit choice and the JSON/CSV/DataFrame round trips."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from instrumented_convs import Summary, region, registry, step
from instrumented_convs.report import choose_unit

GOLDEN = Path(__file__).parent / "golden"
MS = 1_000_000  # ns


def _seed_like_run(clock):
    """The seeds' epoch phases, with a 3-layer GCN's steps inside forward (exact times)."""
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
    assert text + "\n" == path.read_text(), f"rendering changed; if intended, rerun with UPDATE_GOLDEN=1 and review {path}"


def test_table_matches_golden_file(clock):
    _seed_like_run(clock)
    _check_golden("summary_by_step.txt", str(registry.summary()))


def test_layer_table_matches_golden_file(clock):
    _seed_like_run(clock)
    _check_golden("summary_by_layer.txt", str(registry.summary(by="layer").select("forward", max_depth=2)))


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
    [([2.0, 0.001], "s"), ([0.0591, 0.0005], "ms"), ([3e-6], "us"), ([5e-9], "ns"), ([], "ns"), ([0.0], "ns")],
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
