"""Heterogeneous models on the real PyG and DGL: a ``to_hetero`` model counted per model call
under ``run``, its glue inside the region; every layer named with its relation by every route
(``run``, the import swap, ``instrument()``); ``HeteroConv``, ``RGCNConv`` and DGL's
``HeteroGraphConv`` rows by relation adding up to their layer; ``torch.fx`` models told apart
from compiled ones; the table by relation, folded where relations are many."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs import registry
from instrumented_convs.layers.relations import canonical
from instrumented_convs.report import Summary
from instrumented_convs.report.fold import SHOWN

from .helpers import ROOT, outcome, run_script

pyg = pytest.importorskip("torch_geometric")
import torch_geometric.nn as gnn  # noqa: E402

SCRIPT = str(ROOT / "tests" / "scripts" / "hetero_model.py")
RELATIONS = {"author__writes__paper", "paper__cites__paper", "paper__rev_writes__author"}
LAYERS = {f"conv{i}.{r}" for i in (1, 2) for r in RELATIONS}


def _run(tmp_path, *script_args, name="out"):
    """``run`` of the script (``--json`` read back): the rows, and the script's losses."""
    proc = run_script(
        "-m", "instrumented_convs", "run", "-o", name, SCRIPT, *script_args, cwd=tmp_path
    )
    view = run_script(
        "-m", "instrumented_convs", "view", name, "--by", "layer", "--json", cwd=tmp_path
    )
    losses = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    return json.loads(view.stdout)["rows"], losses


def _to_hetero_or_skip():
    from torch_geometric.nn import to_hetero

    _, exc = outcome(lambda: to_hetero(_gnn(gnn), _hetero_data().metadata()))
    if exc is not None:  # PyG 2.3 to 2.5 cannot trace with torch 2.13: stock fails alike
        assert "Union" in str(exc)
        pytest.skip(f"to_hetero fails with this PyG and torch: {exc}")


# -- to_hetero under run: counted per model call, named by relation --------------------------


@pytest.mark.parametrize("swap", [False, True], ids=["stock-layers", "import-swap"])
def test_run_counts_a_to_hetero_model_per_call_and_names_its_layers(tmp_path, swap):
    _to_hetero_or_skip()
    extra = ("--swap",) if swap else ()
    plain = run_script(SCRIPT, "--kind", "to_hetero", *extra, cwd=tmp_path)
    rows, losses = _run(tmp_path, "--kind", "to_hetero", *extra)
    assert losses == [x for x in plain.stdout.splitlines() if x.startswith("step ")]
    top = {r["name"]: r for r in rows if r["depth"] == 0 and r["phase"] == "forward"}
    assert top["forward"]["count"] == 10 and top["forward (no grad)"]["count"] == 1
    layers = [r for r in rows if r["name"] == "forward/SAGEConv"]
    assert {r["scope"] for r in layers} == LAYERS
    assert all(r["count"] == 10 and r["scope"].endswith("." + r["relation"]) for r in layers)
    # One region a model call, its six convs inside: the glue between them (to_hetero's sums
    # over relations) is the region's own time, not outside every row.
    assert top["forward"]["self_time"] > 0
    assert not [r for r in rows if r["depth"] == 0 and "SAGEConv" in r["name"]]


def test_run_tells_fx_and_exported_models_from_compiled_ones(tmp_path):
    counted = {}
    for kind in ("fx", "export", "compile"):
        rows, _ = _run(tmp_path, "--kind", kind, "--steps", "4", name=kind)
        counted[kind] = {}
        for r in rows:  # (rows by layer: a path's layers added)
            if r["phase"] == "forward":
                counted[kind][r["name"]] = counted[kind].get(r["name"], 0) + r["count"]
    for kind in ("fx", "export"):  # a model of the script's: its call is the region
        assert counted[kind]["forward"] == 4 and counted[kind]["forward (no grad)"] == 1, kind
    assert counted["fx"]["forward/SAGEConv"] == 8  # its layers, inside
    assert counted["compile"]["forward/compiled GNN"] == 4  # compiled: as before


# -- the import swap and instrument(): the same names and relations --------------------------


def _hetero_data():
    from torch_geometric.data import HeteroData

    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["author"].x = torch.randn(20, 8, generator=g)
    data["paper"].x = torch.randn(30, 8, generator=g)
    writes = torch.stack(
        [torch.randint(0, 20, (60,), generator=g), torch.randint(0, 30, (60,), generator=g)]
    )
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "cites", "paper"].edge_index = torch.randint(0, 30, (2, 90), generator=g)
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    return data


def _gnn(module):
    class GNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = module.SAGEConv((-1, -1), 16)
            self.conv2 = module.SAGEConv((-1, -1), 4)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    return GNN()


@pytest.mark.parametrize("route", ["import-swap", "instrument"])
def test_to_hetero_layers_named_with_their_relation_by_every_route(route):
    _to_hetero_or_skip()
    from torch_geometric.nn import to_hetero

    from instrumented_convs import pyg as P

    data = _hetero_data()
    torch.manual_seed(0)
    stock = to_hetero(_gnn(gnn), data.metadata())
    torch.manual_seed(0)
    model = to_hetero(_gnn(P if route == "import-swap" else gnn), data.metadata())
    inputs = (data.x_dict, data.edge_index_dict)
    with torch.no_grad():
        stock(*inputs), model(*inputs)
    model.load_state_dict(stock.state_dict())
    if route == "instrument":
        ic.instrument(model)
    registry.reset()
    out, want = model(*inputs), stock(*inputs)
    assert all(torch.equal(out[k], want[k]) for k in want)
    s = registry.summary(by="layer")
    layers = [r for r in s.rows if r.step == "SAGEConv"]
    assert {r.scope for r in layers} == LAYERS and all(r.count == 1 for r in layers)
    assert {(r.scope.split(".", 1)[1], r.relation) for r in layers} == {(x, x) for x in RELATIONS}
    # by relation: each relation's two layers added together, adding up to the step's row
    by_relation = registry.summary(by="relation")
    rows = [r for r in by_relation.rows if r.step == "SAGEConv"]
    assert {r.relation: r.count for r in rows} == dict.fromkeys(RELATIONS, 2)
    merged = registry.summary()["SAGEConv"]
    assert math.isclose(sum(r.total for r in rows), merged.total, rel_tol=1e-9)


def test_one_spelling_of_a_relation():
    assert canonical(("author", "writes", "paper")) == "author__writes__paper"
    assert canonical("<author___writes___paper>") == "author__writes__paper"  # PyG 2.4 on
    assert canonical("author__writes__paper") == "author__writes__paper"  # to_hetero, PyG 2.3
    assert canonical("('user', 'follows', 'game')") == "user__follows__game"  # DGL's str()
    assert canonical("<v#1___to___w>") == "v.1__to__w"  # PyG keeps '.' as '#'
    assert canonical("follows") == "follows"  # a DGL edge type's name


def _adds_up(summary: Summary, layer: str, work: tuple) -> list:
    """The outermost rows of relations under ``layer``'s forward row: all of its per-relation
    ``work`` (steps named so) is in them, none outside; each path's relations add up to that
    path's row in a summary by step."""
    rows = list(summary.rows)
    head = next(r for r in rows if r.step == layer and r.phase == "forward")
    below = [r for r in rows if r.name.startswith(head.name + "/") and r.phase == "forward"]
    related = {r.name for r in below if r.relation is not None}
    outer = [r for r in below if r.relation is not None and r.parent not in related]
    assert outer, [(r.name, r.relation) for r in below]
    assert not [r.name for r in below if r.relation is None and r.step.startswith(work)]
    merged = {r.name: r.total for r in registry.summary().rows if r.phase == "forward"}
    for name in {r.name for r in outer}:  # relations of one path: together, the path's
        together = sum(r.total for r in outer if r.name == name)
        assert math.isclose(together, merged[name], rel_tol=1e-9), name
    return outer


def test_hetero_conv_rows_by_relation_add_up_to_the_layer():
    from instrumented_convs import pyg as P

    data = _hetero_data()
    convs = {
        ("author", "writes", "paper"): P.SAGEConv((8, 8), 4),
        ("paper", "cites", "paper"): P.GCNConv(8, 4),
        ("paper", "rev_writes", "author"): gnn.SAGEConv((8, 8), 4),  # a stock one: named too
    }
    conv = P.HeteroConv(convs)
    registry.reset()
    conv(data.x_dict, data.edge_index_dict)["paper"].sum().backward()
    related = _adds_up(registry.summary(by="relation"), "HeteroConv", ("convs",))
    assert {r.relation for r in related} == RELATIONS
    layers = {r.scope: r.relation for r in registry.summary(by="layer").rows if r.relation}
    assert layers["HeteroConv#" + conv.scope.split("#")[1] + ".convs.author__writes__paper"]
    assert set(layers.values()) == RELATIONS
    # the instrumented children are named after their relation, below the layer's scope
    assert convs[("author", "writes", "paper")].scope == f"{conv.scope}.convs.author__writes__paper"
    assert convs[("paper", "cites", "paper")].relation == "paper__cites__paper"


def test_rgcn_rows_by_relation_add_up_to_the_layer():
    g = torch.Generator().manual_seed(0)
    x, ei = torch.randn(30, 8, generator=g), torch.randint(0, 30, (2, 120), generator=g)
    et = torch.randint(0, 3, (120,), generator=g)
    torch.manual_seed(0)
    stock = gnn.RGCNConv(8, 4, num_relations=3)
    from instrumented_convs import pyg as P

    ours = P.RGCNConv.from_stock(stock)
    registry.reset()
    out = ours(x, ei, et)
    assert torch.equal(out, stock(x, ei, et))
    out.sum().backward()
    related = _adds_up(
        registry.summary(by="relation"), "RGCNConv", ("relation", "propagate", "masked")
    )
    assert [r.relation for r in related] == ["0", "1", "2"]
    assert all(r.step == "relation" and r.count == 1 for r in related)
    backward = [r for r in registry.summary(by="relation").rows if r.phase == "backward"]
    assert {r.relation for r in backward if r.step == "relation"} == {"0", "1", "2"}


def test_dgl_hetero_graph_conv_rows_by_relation_add_up_to_the_layer():
    dgl = pytest.importorskip("dgl")
    import dgl.nn as dnn

    from instrumented_convs import dgl as D

    hg = dgl.heterograph(
        {
            ("user", "plays", "game"): (torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 0])),
            ("game", "played-by", "user"): (torch.tensor([0, 1, 1]), torch.tensor([2, 0, 1])),
        }
    )
    feats = {"user": torch.randn(3, 8), "game": torch.randn(2, 8)}
    torch.manual_seed(0)
    stock = dnn.HeteroGraphConv(
        {"plays": dnn.GraphConv(8, 4), "played-by": dnn.SAGEConv(8, 4, "gcn")}
    )
    for ours in (
        ic.instrument(copy.deepcopy(stock)),
        D.HeteroGraphConv(dict(copy.deepcopy(stock.mods).items())),
    ):
        ours.load_state_dict(stock.state_dict())
        registry.reset()
        out, want = ours(hg, feats), stock(hg, feats)
        assert all(torch.equal(out[k], want[k]) for k in want)
        sum(v.sum() for v in out.values()).backward()
        related = _adds_up(registry.summary(by="relation"), "HeteroGraphConv", ("mods",))
        assert {r.relation for r in related} == {"plays", "played-by"}
        steps = {r.step for r in registry.summary().rows}
        assert "rel_graph = g[stype, etype, dtype] (2)" in steps or any(
            s.startswith("rel_graph = g[") for s in steps
        )  # the slicing of each relation's graph, a step
        assert any("agg_fn" in s for s in steps)  # the aggregation across relations


# -- the table by relation: JSON keeps every row, the text folds the rest -------------------


def _many_relations(n: int) -> Summary:
    """A summary by relation of ``n`` relations' layers (RGCN's loop over its relations)."""
    from instrumented_convs import pyg as P

    g = torch.Generator().manual_seed(1)
    x, ei = torch.randn(40, 4, generator=g), torch.randint(0, 40, (2, 400), generator=g)
    et = torch.randint(0, n, (400,), generator=g)
    conv = P.RGCNConv(4, 2, num_relations=n)
    registry.reset()
    conv(x, ei, et)
    return registry.summary(by="relation")


def test_a_table_of_many_relations_shows_the_largest_and_folds_the_rest():
    n = SHOWN + 5
    s = _many_relations(n)
    relations = [r for r in s.rows if r.step == "relation"]
    assert len(relations) == n  # every row kept: JSON, CSV
    assert {r["relation"] for r in s.to_dict()["rows"] if r["step"] == "relation"} == {
        str(i) for i in range(n)
    }
    text = str(s)
    assert "(5 more relations)" in text
    folded = [line for line in text.splitlines() if "(5 more relations)" in line]
    assert len(folded) == 1
    kept = sorted(relations, key=lambda r: -r.total)[:SHOWN]
    cut = sorted(relations, key=lambda r: -r.total)[SHOWN:]
    shown = {line.split("|")[1].strip() for line in text.splitlines() if "| " in line}
    assert {r.relation for r in kept} <= shown and not {r.relation for r in cut} & shown
    count = int(folded[0].split("|")[2])
    assert count == sum(r.count for r in cut)
    few = str(_many_relations(3))
    assert "more relations" not in few


def test_summary_by_relation_round_trips_and_diffs(tmp_path):
    s = _many_relations(3)
    again = Summary.from_json(s.to_json())
    assert [(r.name, r.relation, r.count) for r in again.rows] == [
        (r.name, r.relation, r.count) for r in s.rows
    ]
    d = s.diff(again)
    assert {row.scope for row in d.rows if row.scope} == {"0", "1", "2"}
    assert "Relation" in d.table()
    slower = Summary(
        [dataclasses.replace(r, mean=r.mean * 2) for r in s.rows], by="relation", total=s.total
    )
    assert len(s.diff(slower).rows) == len(s.rows)  # paired by relation, none added or missing
    with pytest.raises(ValueError, match="relation"):
        registry.summary(by="relations")


def test_the_example_prints_both_frameworks_by_relation():
    """examples/hetero.py: PyG's to_hetero and DGL's HeteroGraphConv on OGB-MAG's shape, the
    loss on papers only (most relations' outputs unused in the last layer): each table by
    relation, every backward call timed."""
    pytest.importorskip("dgl")
    _to_hetero_or_skip()
    out = run_script("examples/hetero.py", "--epochs", "2").stdout
    assert "PyG to_hetero: loss" in out and "DGL HeteroGraphConv: loss" in out
    assert out.count("| Relation ") == 2
    for relation in ("author__writes__paper", "paper__cites__paper", "rev_has_topic"):
        assert relation in out
    assert "not timed" not in out
    backward = [line for line in out.splitlines() if "HeteroGraphConv [backward]" in line]
    assert backward and int(backward[0].split("|")[2]) == 4  # two layers, two epochs


def test_on_demand_adopts_a_fx_model_at_its_first_call(tmp_path):
    """On demand nothing records until a capture asks, and a model is instrumented at its
    first call all the same (a capture's first iteration is as the others): a
    ``torch.fx.GraphModule`` too, its layers named by their paths."""
    from torch_geometric.nn import MessagePassing

    from instrumented_convs.commands.launch.hooks import Hooks
    from instrumented_convs.layers import InstrumentedLayer

    class Leaves(torch.fx.Tracer):
        def is_leaf_module(self, m, name):
            return isinstance(m, MessagePassing) or super().is_leaf_module(m, name)

    data = _hetero_data()
    gnn_ = _gnn(gnn)
    model = torch.fx.GraphModule(gnn_, Leaves().trace(gnn_))
    x, ei = data["paper"].x, data["paper", "cites", "paper"].edge_index
    hooks = Hooks(on_demand=True).install()
    try:
        with ic.configure(record="on-demand", captures=tmp_path):
            model(x, ei)
        ours = {m.scope for m in model.modules() if isinstance(m, InstrumentedLayer)}
    finally:
        hooks.close()
        hooks.remove()
        hooks.put_back()
    assert ours == {"conv1", "conv2"} and hooks.built == {"SAGEConv"}
    assert not [m for m in model.modules() if isinstance(m, InstrumentedLayer)]  # put back


class HeteroNet(torch.nn.Module):
    """A model of one drop-in HeteroConv of two relations (module level: it pickles)."""

    def __init__(self):
        super().__init__()
        from instrumented_convs import pyg as P

        self.conv1 = P.HeteroConv(
            {
                ("author", "writes", "paper"): P.SAGEConv((8, 8), 4),
                ("paper", "cites", "paper"): P.SAGEConv((8, 8), 4),
            }
        )

    def forward(self, x, ei):
        return self.conv1(x, ei)


def test_names_and_relations_survive_renaming_copying_pickling_and_reverting():
    import pickle

    from instrumented_convs.core.storage.registry import registry as store

    data = _hetero_data()
    inputs = (data.x_dict, data.edge_index_dict)
    net = HeteroNet()
    child = net.conv1.convs["author", "writes", "paper"]
    assert child.scope.endswith(".convs.author__writes__paper")  # named by its holder
    ic.name_layers(net, keep=True)  # as run does: the holder's names give way to the paths
    assert child.scope == "conv1.convs.author__writes__paper"
    copy_ = copy.deepcopy(net)
    ic.name_layers(copy_, "ema")  # renaming a copy leaves the original's relation
    registry.reset()
    net(*inputs)
    assert {r.relation for r in registry.summary(by="layer").rows if r.step == "SAGEConv"} == {
        "author__writes__paper",
        "paper__cites__paper",
    }
    store.relations.clear()  # (as a fresh process has it)
    loaded = pickle.loads(pickle.dumps(net))
    registry.reset()
    loaded(*inputs)
    assert {r.relation for r in registry.summary(by="layer").rows if r.step == "SAGEConv"} == {
        "author__writes__paper",
        "paper__cites__paper",
    }
    ic.uninstrument(net.conv1.convs)  # its modules stock again, the holder still ours
    registry.reset()
    net(*inputs)  # (the holder's cache of its children's steps is made again)
    assert "conv1.convs.author__writes__paper" in {r.scope for r in registry.summary(by="layer")}


def test_a_table_by_layer_folds_the_layers_of_the_smaller_relations():
    from instrumented_convs.report import Row

    def row(scope, relation, total):
        return Row("forward/SAGEConv", "SAGEConv", 1, scope, "step", 1, total, total, total,
                   total, total, 0.0, 0.0, 0.0, relation=relation)  # fmt: skip

    top = Row("forward", "forward", 0, None, "region", 1, 100.0, 1.0, 100.0, 100.0, 100.0,
              0.0, 1.0, 0.0)  # fmt: skip
    rows = [top] + [
        row(f"conv{i}.r{k}", f"r{k}", float(k + i)) for k in range(SHOWN + 2) for i in (1, 2)
    ]
    text = str(Summary(rows, by="layer", total=100.0))
    layers = {line.split("|")[1].strip() for line in text.splitlines()[2:-2] if "|" in line}
    assert "(4 more layers)" in layers  # the two smallest relations' two layers each
    assert not {"conv1.r0", "conv2.r0", "conv1.r1", "conv2.r1"} & layers
    assert {"conv1.r2", "conv2.r2", f"conv1.r{SHOWN + 1}"} <= layers
