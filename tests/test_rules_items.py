"""The advice's items and text, whole (report/rules.py): a record with every rule's pattern,
each at or beside its threshold, gives exactly the items and lines in tests/golden/advice
(read when they were written: what they say is what docs/advice.md says each rule gives).
After a change meant to alter them, ``python -m tests.test_rules_items`` writes them anew:
read their diff before committing it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict

import pytest

from instrumented_convs.report.rules import Record, decide, lines
from instrumented_convs.report.stats import summarize

from .helpers import entry_stats as entry

GOLDEN = Path(__file__).parent / "golden" / "advice"
US = 1_000  # ns


def _trial(stock: float, changed: float, aa: float, **more: Any) -> Dict[str, Any]:
    """A change timed on a layer (``layers.trials``' fields), times in seconds."""
    return {"stock_s": stock, "changed_s": changed, "aa_s": aa, "equal": True, "rounds": 5,
            "convert_s": 0.0, "difference": 3e-7, "change": "", **more}  # fmt: skip


def record() -> Record:
    """2.8 ms recorded: PyG's and DGL's layers and launch-bound regions; loaders' waits;
    four iterations."""
    summary = summarize(
        [
            entry("GCNConv", "GCNConv", "conv1", 0, -1, 400 * US),
            entry("gcn_norm", "GCNConv/gcn_norm", "conv1", 1, 0, 100 * US),
            entry("add_remaining_self_loops", "GCNConv/gcn_norm/add_remaining_self_loops",
                  "conv1", 2, 1, 30 * US),
            entry("SAGEConv", "SAGEConv", "conv2", 0, -1, 500 * US),
            entry("SAGEConv", "SAGEConv", "conv2", 0, -1, 100 * US, phase="backward"),
            entry("GraphConv", "GraphConv", "g1", 0, -1, 300 * US),
            entry("zero_in_degree_check", "GraphConv/zero_in_degree_check", "g1", 1, 5, 20 * US),
            entry("train", "train", None, 0, -1, *[58 * US] * 10, kind="region", host=420 * US,
                  dcalls=10, caught=10),
            entry("SGConv", "SGConv", "conv3", 0, -1, 200 * US),
            entry("gcn_norm", "SGConv/gcn_norm", "conv3", 1, 8, 50 * US),
            entry("add_remaining_self_loops", "SGConv/gcn_norm/add_remaining_self_loops",
                  "conv3", 2, 9, 40 * US),
            entry("add_self_loops", "SGConv/gcn_norm/add_remaining_self_loops/add_self_loops",
                  "conv3", 3, 10, 10 * US),  # (inside: counted in the outermost)
            entry("GCNConv", "GCNConv", "conv4", 0, -1, 150 * US),
            entry("gcn_norm", "GCNConv/gcn_norm", "conv4", 1, 12, 45 * US),
            entry("GCNConv", "GCNConv", "conv5", 0, -1, 100 * US),
            entry("gcn_norm", "GCNConv/gcn_norm", "conv5", 1, 14, 30 * US),
            entry("GATConv", "GATConv", "gat", 0, -1, 250 * US),
            entry("GATConv", "GATConv/GATConv", "gat", 1, 16, 200 * US),  # (the outermost only)
            entry("GCNConv", "GCNConv", "conv6", 0, -1, 60 * US),
            entry("add_self_loops", "GCNConv/add_self_loops", "conv6", 1, 18, 10 * US),
            entry("GCNConv", "GCNConv", "conv7", 0, -1, 40 * US),
            entry("GATConv", "GATConv", "g2", 0, -1, 30 * US),
            entry("zero_in_degree_check", "GATConv/zero_in_degree_check", "g2", 1, 21, 5 * US),
            entry("GraphConv", "GraphConv", "g3", 0, -1, 30 * US),
            entry("zero_in_degree_check", "GraphConv/zero_in_degree_check", "g3", 1, 23, 5 * US),
            entry("GraphConv", "GraphConv", "g4", 0, -1, 30 * US),
            entry("GCNConv", "GCNConv", "conv8", 0, -1, 30 * US),
            entry("gcn_norm", "GCNConv/gcn_norm", "conv8", 1, 26, 10 * US),
            entry("GraphConv", "GraphConv", "g5", 0, -1, 10 * US),
            entry("SAGEConv", "SAGEConv", "conv9", 0, -1, 20 * US),
            # launch-bound, its host time not read: nothing at stake; then one read
            entry("eval", "eval", None, 0, -1, *[US] * 10, kind="region", dcalls=10, caught=10),
            entry("test", "test", None, 0, -1, *[US] * 10, kind="region", host=5 * US,
                  dcalls=10, caught=10),
        ],
        by="layer",
    )  # fmt: skip
    pyg_gcn = {
        "framework": "pyg", "path": "conv1", "class": "GCNConv", "calls": 2, "same_graph": True,
        "caches_graph": True, "nodes": 300, "self_loop_nodes": 300,
        "options": {"in_channels": 16, "out_channels": 8, "improved": True, "cached": False,
                    "normalize": True, "add_self_loops": True},
    }  # fmt: skip
    # a class the rules write no constructor for: PyG's order; its cache keeps the features
    sg = {
        "framework": "pyg", "path": "conv3", "class": "SGConv", "calls": 3, "same_graph": True,
        "caches_graph": False, "nodes": 300, "self_loop_nodes": 300,
        "options": {"in_channels": 16, "out_channels": 16, "K": 2, "cached": False,
                    "add_self_loops": True},
    }  # fmt: skip
    # noted before caches_graph was: taken as caching the graph
    old = {
        "framework": "pyg", "path": "conv4", "class": "GCNConv", "calls": 5, "same_graph": True,
        "options": {"in_channels": 8, "out_channels": 4, "cached": False},
    }  # fmt: skip
    # not normalising: nothing to cache
    plain = {
        "framework": "pyg", "path": "conv5", "class": "GCNConv", "calls": 5, "same_graph": True,
        "caches_graph": True,
        "options": {"in_channels": 8, "out_channels": 4, "cached": False, "normalize": False},
    }  # fmt: skip
    # noted without options (GATConv: the changes any layer takes alone)
    gat = {
        "framework": "pyg", "path": "gat", "class": "GATConv", "calls": 4, "same_graph": True,
        "caches_graph": False,
        "trials": {"lower-precision": _trial(
            1e-3, 6e-4, 1e-5, change="torch.autocast('cpu', bfloat16)",
            also_timed=[{"variant": "float16", "changed_s": 7e-4, "equal": True}],
        )},
    }  # fmt: skip
    sage = {
        "framework": "pyg", "path": "conv2", "class": "SAGEConv", "calls": 4, "same_graph": False,
        "options": {"in_channels": 16, "out_channels": 8},
        "trials": {
            # faster, equal, made at every call (the graph changed): 6e-4 * 0.6 - 4 * 2e-5
            "fused-sparse": _trial(
                1e-3, 4e-4, 1e-5, paired_saving_s=5.5e-4, faster_rounds=4, convert_s=2e-5,
                change="SAGEConv(16, 8) given adj_t", variant="SparseTensor", tolerance=1e-4,
                also_timed=[{"variant": "torch.sparse CSR", "changed_s": 5e-4, "equal": True},
                            {"variant": "EdgeIndex", "changed_s": 3e-4, "equal": False}],
            ),
            # saved exactly the A/A: not faster
            "project-first": _trial(1e-3, 9e-4, 1e-4, paired_saving_s=1e-4),
            # faster within a looser tolerance
            "lower-precision": _trial(1e-3, 9e-4, 2e-5, paired_saving_s=5e-5, tolerance=1e-2,
                                      difference=4e-3, change="torch.autocast('cpu', bfloat16)"),
            # faster, but compiling costs more than the run's calls save
            "compiled-layer": _trial(1e-3, 5e-4, 1e-5, convert_s=1e-3, convert_once=True,
                                     change="torch.compile(layer)"),
        },
    }  # fmt: skip
    dgl = {
        "framework": "dgl", "path": "g1", "class": "GraphConv", "calls": 3, "same_graph": True,
        "zero_in_degree_nodes": 0, "graph_remade": True, "fresh_graph_calls": 3,
        "options": {"in_feats": 16, "out_feats": 8, "norm": "both",
                    "allow_zero_in_degree": False},
        "trials": {
            "cache-normalization": _trial(2e-4, 1e-4, 1e-6, convert_s=1e-5,
                                          change="EdgeWeightNorm once, norm='none'"),
            "graph-formats": _trial(3e-4, 1.5e-4, 1e-6, change="one graph, formats made"),
            "lower-precision": _trial(2e-4, 1.6e-4, 1e-6, tolerance=1e-2, difference=2e-3,
                                      change="torch.autocast('cpu', bfloat16)"),
            "compiled-layer": _trial(2e-4, 1e-4, 1e-6, convert_s=2e-5, convert_once=True,
                                     change="torch.compile(layer)"),
        },
    }  # fmt: skip
    loaders = {"loaders": [
        {"label": "DataLoader at train.py:9", "workers": 2, "wait": 100 * US},
        {"label": "DataLoader at train.py:30", "workers": 0, "wait": 0},
        {"label": "DataLoader at train.py:31", "workers": 0},  # (no wait noted)
        {"label": "DataLoader at train.py:40", "wait": 50 * US},  # (no workers noted)
    ]}  # fmt: skip
    # called once (nothing to cache), its loops added by add_self_loops
    once = {
        "framework": "pyg", "path": "conv6", "class": "GCNConv", "calls": 1, "same_graph": True,
        "caches_graph": True, "nodes": 50, "self_loop_nodes": 50,
        "options": {"in_channels": 8, "out_channels": 4, "cached": False, "add_self_loops": True},
    }  # fmt: skip
    # no row of the steps the rules name: nothing at stake
    cold = {
        "framework": "pyg", "path": "conv7", "class": "GCNConv", "calls": 2, "same_graph": True,
        "caches_graph": True, "nodes": 20, "self_loop_nodes": 20,
        "options": {"in_channels": 8, "out_channels": 4, "cached": False, "add_self_loops": True},
    }  # fmt: skip
    # noted without options: not told to change one
    dgl_gat = {"framework": "dgl", "path": "g2", "class": "GATConv", "calls": 2,
               "same_graph": True, "zero_in_degree_nodes": 0}  # fmt: skip
    # nodes without an in-edge: the check is needed
    lonely = {
        "framework": "dgl", "path": "g3", "class": "GraphConv", "calls": 2, "same_graph": True,
        "zero_in_degree_nodes": 5,
        "options": {"in_feats": 8, "out_feats": 4, "allow_zero_in_degree": False},
    }  # fmt: skip
    # no check's row: nothing at stake
    unchecked = dict(lonely, path="g4", zero_in_degree_nodes=0)
    # its graph not made anew; then one made anew, its fresh calls not noted: nothing saved
    unchecked["graph_remade"] = False
    unchecked["trials"] = {"graph-formats": _trial(3e-4, 1.5e-4, 1e-6, change="one graph")}
    unnoted = dict(unchecked, path="g5", graph_remade=True, calls=4)
    narrow = {
        "framework": "pyg", "path": "conv9", "class": "SAGEConv", "calls": 4, "same_graph": True,
        "options": {"in_channels": 64, "out_channels": 4},
        "trials": {"project-first": _trial(2e-4, 1e-4, 1e-6,
                                           change="SAGEConv(64, 4, project=True)")},
    }  # fmt: skip
    # noted before either options or caches_graph were
    older = {"framework": "pyg", "path": "conv8", "class": "GCNConv", "calls": 2,
             "same_graph": True}  # fmt: skip
    layers = [pyg_gcn, sage, dgl_gat, lonely, unchecked, dgl, unnoted, sg, once, cold, old,
              plain, gat, older, narrow]  # fmt: skip
    return Record(summary, {"layers": layers}, loaders, iterations=4)


def _golden(name: str) -> str:
    return (GOLDEN / name).read_text()


def _write_golden() -> None:
    items = decide(record(), min_share=0.0)
    (GOLDEN / "items.json").write_text(json.dumps(items, indent=1) + "\n")
    (GOLDEN / "lines.txt").write_text("\n".join(lines(items, min_share=0.0)) + "\n")


def test_every_rules_items_and_lines_are_what_was_read_and_written():
    items = decide(record(), min_share=0.0)
    assert items == json.loads(_golden("items.json"))
    assert "\n".join(lines(items, min_share=0.0)) + "\n" == _golden("lines.txt")


def _paths(items):
    return [(i["rule"], i["layers"][0]["path"]) for i in items]


def test_at_the_threshold_an_item_is_kept_and_a_rules_small_items_that_reach_it_together():
    """At 5%: PyG's cache-normalization items, 3.6% and 1.6%, kept together (5.2%), and so
    are the loaders' 3.6% and 1.8%; self-loops-present's four (3.6% together) are dropped.
    An item at the threshold exactly is kept, and small items that reach it exactly
    together. (Equal shares keep the rules' order.)"""
    assert _paths(decide(record())) == [
        ("fused-sparse", "conv2"),
        ("lower-precision", "conv2"),
        ("host-bound", "train"),
        ("lower-precision", "g1"),
        ("compiled-layer", "g1"),
        ("cache-normalization", "g1"),
        ("lower-precision", "gat"),
        ("graph-formats", "g1"),
        ("cache-normalization", "conv1"),
        ("loader-workers", "DataLoader at train.py:9"),
        ("loader-workers", "DataLoader at train.py:40"),
        ("cache-normalization", "conv4"),
    ]
    items = decide(record(), min_share=0.0)
    share = {p: i["at_stake_share"] for p, i in zip(_paths(items), items)}
    at = share[("lower-precision", "gat")]
    assert ("lower-precision", "gat") in _paths(decide(record(), min_share=at))
    assert ("lower-precision", "gat") not in _paths(decide(record(), math.nextafter(at, 1)))
    together = share[("cache-normalization", "conv1")] + share[("cache-normalization", "conv4")]
    kept = _paths(decide(record(), min_share=together))
    assert ("cache-normalization", "conv1") in kept and ("cache-normalization", "conv4") in kept
    kept = _paths(decide(record(), min_share=math.nextafter(together, 1)))
    assert ("cache-normalization", "conv1") not in kept


@pytest.mark.parametrize(
    "wait,said", [(1e9, "1 s"), (999e6, "999 ms"), (12.44e9, "12.4 s"), (3.714e6, "3.71 ms")]
)
def test_a_duration_reads_as_the_table_would(wait, said):
    summary = SimpleNamespace(total=1.0, rows=[], by="layer")
    loaders = {"loaders": [{"label": "L", "workers": 0, "wait": wait}]}
    (item,) = decide(Record(summary, loaders=loaders), min_share=0.0)
    assert item["why"] == f"the loop waited {said} for L's batches"


def test_a_run_that_recorded_no_time_puts_nothing_at_stake():
    summary = SimpleNamespace(total=0.0, rows=[], by="layer")
    loaders = {"loaders": [{"label": "L", "workers": 0, "wait": 1e6}]}
    (item,) = decide(Record(summary, loaders=loaders), min_share=0.0)
    assert item["at_stake_share"] == 0.0


def test_ranks_layers_and_no_measured_saving_in_a_line():
    item = {"rule": "r", "layers": [{"path": "conv", "class": "GCNConv"},
                                    {"path": "conv2", "class": "GCNConv"}], "change": "c",
            "why": "w", "valid_when": "v", "outputs": "o", "at_stake_share": 0.25,
            "measured_saving_share": None, "ranks": [0, 2]}  # fmt: skip
    assert lines([item]) == [
        "What to change",
        "  25% at stake (at most) in conv (GCNConv), conv2 (GCNConv) on ranks 0, 2: c",
        "    why: w; valid when v; outputs o",
    ]
    assert lines([], min_share=0.1) == [
        "What to change",
        "  nothing worth 10% or more of the recorded time",
    ]


if __name__ == "__main__":
    _write_golden()
