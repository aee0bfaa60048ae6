"""Generic DGL layers: DGL's kernels as steps inside our layers only, detailed layers nested in
generic ones, HeteroGraphConv wrapping convs."""

from __future__ import annotations

import copy

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs import registry

dgl = pytest.importorskip("dgl")
from dgl.nn import pytorch as dnn  # noqa: E402

from instrumented_convs import dgl as D  # noqa: E402


def _dgl_graph():
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 10, (30,), generator=g), torch.randint(0, 10, (30,), generator=g)
    return dgl.add_self_loop(dgl.graph((src, dst), num_nodes=10)), torch.randn(10, 8, generator=g)


def test_dgl_kernels_are_steps_only_inside_instrumented_layers():
    graph, x = _dgl_graph()
    torch.manual_seed(0)
    ours = D.GATConv(8, 4, 2)
    assert D.GATConv.__module__ == "instrumented_convs.dgl"
    ours(graph, x).sum().backward()
    s = registry.summary()
    for path in (
        "GATConv/fc",
        "GATConv/apply_edges/gsddmm",
        "GATConv/edge_softmax",
        "GATConv/update_all/gspmm",
    ):
        assert s[path].count == 1, path
    assert any(r.name == "GATConv/update_all/gspmm" and r.phase == "backward" for r in s.rows)
    registry.reset()
    dnn.GATConv(8, 4, 2)(graph, x)  # a stock layer, DGL's functions wrapped: records nothing
    with graph.local_scope():  # user code calling DGL's functions directly
        graph.ndata["h"] = x
        graph.update_all(dgl.function.copy_u("h", "m"), dgl.function.sum("m", "h"))
    assert len(registry.summary()) == 0


def test_dgl_graph_scopes_and_transforms_are_steps_inside_instrumented_layers_only():
    """Entering and leaving ``graph.local_scope()`` (copies of the feature frames, the local
    features dropped) and a layer's own graph transforms are steps of the layer; elsewhere
    DGL's own context manager and functions run."""
    graph, x = _dgl_graph()
    torch.manual_seed(0)
    ours = D.TWIRLSConv(8, 4, 6, prop_step=2)
    stock = copy.deepcopy(ours)
    stock.__class__ = dnn.TWIRLSConv
    torch.manual_seed(1)
    expected = stock(graph, x)
    torch.manual_seed(1)
    assert torch.equal(ours(graph, x), expected)
    D.GINConv(torch.nn.Linear(8, 4), "sum")(graph, x)
    s = registry.summary()
    for path in ("TWIRLSConv/remove_self_loop", "TWIRLSConv/add_self_loop"):
        assert s[path].count == 1, path
    assert s["GINConv/local_scope"].count == s["GINConv/local_scope_exit"].count == 1
    paths = [r.name for r in s.rows if r.name.startswith("GINConv/")]
    assert paths[0] == "GINConv/local_scope" and paths[-1] == "GINConv/local_scope_exit"
    registry.reset()
    with graph.local_scope() as scope:  # user code: DGL's own, nothing recorded
        assert type(graph.local_scope()).__module__ == "contextlib" and scope is None
        graph.remove_self_loop()
    assert len(registry.summary()) == 0


def test_dgl_detailed_graph_conv_inside_a_generic_layer_keeps_its_steps():
    graph, x = _dgl_graph()
    torch.manual_seed(0)
    stock = dnn.GroupRevRes(dnn.GraphConv(4, 4), groups=2)
    ours = ic.instrument(copy.deepcopy(stock))
    assert type(ours) is D.GroupRevRes and type(ours.gnn_modules[0]) is D.GraphConv
    # GroupRevRes frees its input's storage: each run gets its own copy
    assert torch.equal(ours(graph, x.clone()), stock(graph, x.clone()))
    s = registry.summary()
    paths = [r.name for r in s.rows if r.phase == "forward"]
    # (its _forward, handed to an autograd Function that calls it, is a step wherever it runs)
    assert "GroupRevRes/_forward/gnn_modules.0/GraphConv/update_all" in paths
    # the detailed layer's copy times DGL's calls itself, nested in a generic layer or not
    assert not any(
        p.startswith("GroupRevRes/_forward/gnn_modules.0/GraphConv/update_all/") for p in paths
    ), paths


def test_dgl_group_rev_res_backward_recomputes_in_steps_of_the_backward():
    """GroupRevRes's backward is one autograd Function that inverts its output, runs its
    forward again and differentiates it with torch.autograd.grad: three steps under the
    layer's backward row (backward rows: run in the backward pass), the gradients stock's."""
    graph, x = _dgl_graph()
    torch.manual_seed(0)
    stock = dnn.GroupRevRes(dnn.GraphConv(4, 4), groups=2)
    ours = ic.instrument(copy.deepcopy(stock))
    ic.configure(backward_every=1)
    grads = []
    for layer in (stock, ours):
        xi = x.clone().requires_grad_()
        layer(graph, xi).pow(2).sum().backward()
        grads.append((xi.grad, [p.grad for p in layer.parameters()]))
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))
    rows = {(r.name, r.phase): r.count for r in registry.summary().rows}
    for part in ("_inverse", "_forward", "autograd.grad"):
        assert rows[f"GroupRevRes/{part}", "backward"] == 1, part
    assert rows["GroupRevRes/_forward", "forward"] == 1  # the forward's own call, apart
    assert ("GroupRevRes/_forward/GraphConv/update_all", "backward") in rows  # recomputed
    registry.reset()
    xi = x.clone().requires_grad_()
    assert torch.equal(torch.autograd.grad((xi * 2).sum(), xi)[0], torch.full_like(x, 2.0))
    assert len(registry.summary()) == 0  # outside any step's backward: torch's own, untimed


def test_dgl_hetero_graph_conv_wrapping_convs():
    hg = dgl.heterograph(
        {
            ("a", "r", "b"): (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1])),
            ("b", "s", "a"): (torch.tensor([0, 1]), torch.tensor([2, 0])),
        }
    )
    feats = {"a": torch.randn(3, 8), "b": torch.randn(2, 8)}
    torch.manual_seed(0)
    stock = dnn.HeteroGraphConv({"r": dnn.GraphConv(8, 4), "s": dnn.SAGEConv(8, 4, "gcn")})
    ours = ic.instrument(copy.deepcopy(stock))
    out, want = ours(hg, feats), stock(hg, feats)
    assert all(torch.equal(out[k], want[k]) for k in want)
    s = registry.summary(by="layer")
    tops = {r.scope for r in s.rows if r.depth == 0 and r.kind != "tool"}  # (a first call's)
    assert tops == {"HeteroGraphConv"}  # instrumented too
    # each relation's conv: a child step of its relation, in the conv's own scope
    assert {(r.scope, r.relation) for r in s.rows if r.step in ("GraphConv", "SAGEConv")} == {
        ("mods.r", "r"),
        ("mods.s", "s"),
    }
