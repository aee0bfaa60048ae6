"""Summaries merged over ranks: the merge on plain data, and two real processes over gloo.

The two-process tests start ``tests/dist_worker.py`` with torchrun (``python -m
torch.distributed.run --standalone --nproc-per-node 2``), as a user starts a DDP job; each
rank writes what ``summary(all_ranks=True)`` gave it, and the tests check the numbers.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs.core.storage.registry import Registry
from instrumented_convs.report import Summary
from instrumented_convs.report.stats import merge_ranks, summarize

from .helpers import ROOT, gpu, run_torchrun


def _registry(*records: tuple) -> Registry:
    reg = Registry()
    for path, seconds in records:
        reg.add(path, seconds)
    return reg


def _cells(table: str, label: str) -> List[str]:
    """The cells of the table line that starts with ``label`` (after indentation)."""
    line = next(line for line in table.splitlines() if line.lstrip().startswith(label.lstrip()))
    return [cell.strip() for cell in line.split("|")]


def _same_rows(back: Summary, original: Summary) -> None:
    """CSV and DataFrame keep the rows and each rank's rows (not the grand total's last bit)."""
    assert back.rows == original.rows and back.world_size == original.world_size
    if original.world_size is not None:
        assert [p.rows for p in back.by_rank()] == [p.rows for p in original.by_rank()]
    assert back.total == pytest.approx(original.total)


def _two_ranks() -> Summary:
    r0 = _registry(("epoch", 2.0), ("epoch/forward", 1.0), ("epoch", 2.0), ("epoch/forward", 1.0))
    r1 = _registry(
        ("epoch", 3.0),
        ("epoch/forward", 0.5),
        ("epoch/extra", 1.5),
        ("epoch", 1.0),
        ("epoch/forward", 0.5),
        ("epoch", 2.0),
        ("epoch/forward", 0.5),
    )
    return merge_ranks([r0.snapshot(), r1.snapshot()])


# -- the merge, on plain data ------------------------------------------------------------------
def test_merge_sums_counts_and_totals_and_takes_min_max_over_ranks():
    s = _two_ranks()
    epoch, forward, extra = s["epoch"], s["epoch/forward"], s["epoch/extra"]
    assert (epoch.count, forward.count, extra.count) == (5, 5, 1)
    assert epoch.total == pytest.approx(10.0) and forward.total == pytest.approx(3.5)
    assert (epoch.min, epoch.max) == (1.0, 3.0)
    assert (forward.min, forward.max) == (0.5, 1.0)
    calls = torch.tensor([2.0, 2.0, 3.0, 1.0, 2.0], dtype=torch.float64)
    assert epoch.std == pytest.approx(float(calls.std()))  # all calls pooled
    assert epoch.self_time == pytest.approx(10.0 - 3.5 - 1.5)
    assert s.total == pytest.approx(10.0) and epoch.fraction == 1.0
    assert forward.fraction == pytest.approx(0.35)
    assert [r.name for r in s] == ["epoch", "epoch/forward", "epoch/extra"]  # rank 0's order first
    assert all(r.rank is None for r in s)


def test_merged_rows_show_the_spread_across_ranks():
    s = _two_ranks()
    epoch, forward, extra = s["epoch"], s["epoch/forward"], s["epoch/extra"]
    assert (epoch.ranks, epoch.slowest, epoch.slowest_rank, epoch.fastest) == (2, 6.0, 1, 4.0)
    assert epoch.spread == pytest.approx(1.5)
    assert (forward.slowest, forward.slowest_rank, forward.fastest) == (2.0, 0, 1.5)
    assert (extra.ranks, extra.slowest_rank, extra.spread) == (1, 1, 1.0)  # rank 1 only
    table = str(s)
    assert "2 ranks merged" in table.splitlines()[0]
    assert "Slowest" in table and "Spread" in table
    assert _cells(table, "- epoch ")[-2:] == ["6.000 r1", "1.50x"]
    assert _cells(table, "- extra ")[-2:] == ["1.500 r1", "1.00x 1/2"]
    assert "Slowest" not in s.table(spread=False)
    assert "Slowest" not in str(s.by_rank()[0])  # a part is one rank's own table


def test_a_rank_whose_calls_were_untimed_is_not_the_fastest():
    r0, r1 = Registry(), Registry()
    r0.record_untimed(r0.child(r0.root, "captured"))  # e.g. inside a CUDA-graph capture
    r1.add("captured", 2.0)
    row = merge_ranks([r0.snapshot(), r1.snapshot()])["captured"]
    assert (row.count, row.untimed, row.ranks, row.slowest, row.fastest, row.spread) == (
        1,
        1,
        1,
        2.0,
        2.0,
        1.0,
    )
    none = merge_ranks([r0.snapshot(), Registry().snapshot()])["captured"]
    assert none.untimed == 1 and none.slowest is None and none.spread is None


def test_by_rank_gives_each_rank_its_own_summary():
    s = _two_ranks()
    r0, r1 = s.by_rank()
    assert s.world_size == 2
    assert [r.name for r in r0] == ["epoch", "epoch/forward"]
    assert (r0["epoch"].count, r1["epoch"].count, r1["epoch/extra"].count) == (2, 3, 1)
    assert r1.total == pytest.approx(6.0) and r1["epoch/forward"].fraction == pytest.approx(0.25)
    assert {r.rank for r in r0} == {0} and {r.rank for r in r1} == {1}
    assert r1["epoch"].slowest is None  # spread belongs to merged rows
    part = s.select("epoch/forward")
    assert [r.name for r in part] == ["epoch/forward"] and part.total == s.total
    assert [len(p) for p in part.by_rank()] == [1, 1]


def test_a_summary_of_one_process_has_no_ranks():
    s = summarize(_registry(("epoch", 1.0)).snapshot())
    assert s.world_size is None
    with pytest.raises(ValueError, match="all_ranks=True"):
        s.by_rank()
    assert "ranks merged" not in str(s) and "Slowest" not in str(s)


def test_exports_keep_the_rank():
    s = _two_ranks()
    assert Summary.from_json(s.to_json()) == s
    assert Summary.from_dict(json.loads(s.to_json())).by_rank()[1]["epoch"].count == 3
    _same_rows(Summary.from_csv(s.to_csv()), s)
    lines = s.to_csv().splitlines()
    assert len(lines) == 1 + len(s) + sum(len(p) for p in s.by_rank())
    pd = pytest.importorskip("pandas")
    frame = s.to_dataframe()
    assert list(frame["rank"].isna()) == [True] * 3 + [False] * 5
    _same_rows(Summary.from_dataframe(frame), s)
    assert isinstance(frame, pd.DataFrame)
    one = s.by_rank()[1]  # one rank's part alone round-trips as itself
    _same_rows(Summary.from_csv(one.to_csv()), one)
    assert Summary.from_csv(one.to_csv()).world_size is None


def test_merge_by_layer_keeps_each_instance():
    a, b = Registry(), Registry()
    a.add("conv/lin", 1.0, scope="convs.0")
    b.add("conv/lin", 3.0, scope="convs.0")
    b.add("conv/lin", 2.0, scope="convs.1")
    s = merge_ranks([a.snapshot(), b.snapshot()], by="layer")
    rows = {(r.scope, r.name): r for r in s}
    assert rows["convs.0", "conv/lin"].count == 2 and rows["convs.0", "conv/lin"].slowest == 3.0
    assert rows["convs.1", "conv/lin"].ranks == 1


def test_all_ranks_without_a_process_group_is_a_clear_error():
    ic.registry.add("epoch", 1.0)
    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        ic.registry.summary(all_ranks=True)
    with pytest.raises(RuntimeError, match="torchrun"):
        ic.registry.summary(all_ranks=True)
    assert ic.registry.summary()["epoch"].count == 1  # the registry is untouched


# -- two real processes over gloo --------------------------------------------------------------
def _torchrun(out: Any, backend: str, nproc: int) -> List[Dict[str, Any]]:
    run_torchrun(
        str(ROOT / "tests" / "dist_worker.py"), str(out), backend, nproc=nproc, timeout=600
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def gloo_ranks(tmp_path_factory):
    return _torchrun(tmp_path_factory.mktemp("gloo"), "gloo", 2)


def test_two_processes_merge_exact_counts_when_ranks_do_different_work(gloo_ranks):
    merged = Summary.from_dict(gloo_ranks[0]["merged"])
    assert merged.world_size == 2
    assert merged["epoch"].count == 3 + 4 and merged["epoch/forward"].count == 7
    # fake clock: rank r's forward takes (r + 1) us, its epoch twice that
    assert merged["epoch/forward"].total == pytest.approx((3 * 1 + 4 * 2) * 1e-6)
    assert merged["epoch"].total == pytest.approx((3 * 2 + 4 * 4) * 1e-6)
    assert (merged["epoch"].min, merged["epoch"].max) == (pytest.approx(2e-6), pytest.approx(4e-6))
    assert merged["epoch"].slowest_rank == 1 and merged["epoch"].spread == pytest.approx(16 / 6)
    name = gloo_ranks[0]["layer"]  # GCNConv, or DGL's GraphConv where PyG is not installed
    layer = merged[f"layer/{name}"]  # real time, exact counts: rank r ran 2 + r passes
    assert layer.count == 2 + 3 and merged[f"layer/{name}/{gloo_ranks[0]['inner']}"].count == 5
    backward = [r for r in merged.find(name) if r.phase == "backward"]
    assert backward and backward[0].count == 5


def test_two_processes_every_rank_gets_the_same_merge(gloo_ranks):
    assert gloo_ranks[0]["merged"] == gloo_ranks[1]["merged"]
    assert gloo_ranks[0]["by_layer"] == gloo_ranks[1]["by_layer"]


def test_two_processes_by_rank_counts(gloo_ranks):
    merged = Summary.from_dict(gloo_ranks[1]["merged"])
    parts = merged.by_rank()
    assert [p["epoch"].count for p in parts] == [3, 4]
    assert [p["layer/" + gloo_ranks[0]["layer"]].count for p in parts] == [2, 3]
    for rank, part in enumerate(parts):  # each part is what that rank's own summary says
        own = Summary.from_dict(gloo_ranks[rank]["mine"])
        assert [(r.name, r.count, r.total) for r in part] == [
            (r.name, r.count, r.total) for r in own
        ]


def test_two_processes_a_step_of_one_rank_still_appears(gloo_ranks):
    merged = Summary.from_dict(gloo_ranks[0]["merged"])
    only = merged["only_last"]
    assert (only.count, only.ranks, only.slowest_rank) == (1, 1, 1)
    assert only.total == pytest.approx(7e-6)
    assert "only_last" not in merged.by_rank()[0] and "only_last" in merged.by_rank()[1]
    assert _cells(gloo_ranks[0]["table"], "- only_last ")[-1] == "1.00x 1/2"


def test_two_processes_table_exports_and_layers(gloo_ranks):
    rank0 = gloo_ranks[0]
    assert "2 ranks merged" in rank0["table"] and "Spread" in rank0["table"]
    assert "Spread" not in rank0["plain_table"]
    merged = Summary.from_dict(rank0["merged"])
    _same_rows(Summary.from_csv(rank0["csv"]), merged)
    by_layer = Summary.from_dict(rank0["by_layer"])
    assert {r.scope for r in by_layer if r.name.startswith("layer/" + rank0["layer"])} == {"conv"}
    assert by_layer.by == "layer" and by_layer.world_size == 2


def test_two_processes_error_before_init_and_subgroups(gloo_ranks):
    for rank in gloo_ranks:
        assert "init_process_group" in rank["error"]
    alone = Summary.from_dict(gloo_ranks[1]["alone"])  # the group of rank 1 alone
    assert alone.world_size == 1 and alone["epoch"].count == 4
    assert "not a member" in gloo_ranks[0]["alone"]


@gpu
def test_nccl_merges_over_the_gpus(tmp_path):
    nproc = min(2, torch.cuda.device_count())
    ranks = _torchrun(tmp_path, "nccl", nproc)
    merged = Summary.from_dict(ranks[0]["merged"])
    assert merged.world_size == nproc
    assert merged["epoch"].count == sum(3 + r for r in range(nproc))
    assert merged["layer/" + ranks[0]["layer"]].count == sum(2 + r for r in range(nproc))
    assert ranks[0]["merged"] == ranks[-1]["merged"]
