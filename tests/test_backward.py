"""The backward of steps: rows with ``phase="backward"``, nested like the forward, checked
against the real stock layers (gradients unchanged), with exact fake-clock times, across
autograd's odd corners (retain_graph, autograd.grad, double backward, checkpoint, a backward
that raises, threads) and the switches that turn it off.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import tracemalloc

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("DGLBACKEND", "pytorch")  # before dgl is first imported (lazily, below)
from torch.utils.checkpoint import checkpoint  # noqa: E402

try:  # the newest-DGL environment has no PyG: its tests skip there, the rest run
    from torch_geometric.nn import GCNConv as StockGCN
    from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
except ImportError:
    StockGCN = None
needs_pyg = pytest.mark.skipif(StockGCN is None, reason="needs torch_geometric")

import instrumented_convs as ic  # noqa: E402
from instrumented_convs import region, registry  # noqa: E402
from instrumented_convs.core.backward import hooks as _bw  # noqa: E402
from instrumented_convs.layers import step  # noqa: E402
from instrumented_convs.report import Summary  # noqa: E402

if StockGCN is not None:
    from instrumented_convs.pyg import GCNConv
from instrumented_convs.testing import depth, open_steps  # noqa: E402

from .fakes import Advance  # noqa: E402
from .helpers import run_script  # noqa: E402

SEC = 1e-9  # one nanosecond in seconds
N, FIN, FOUT = 12, 6, 5


# -- helpers ------------------------------------------------------------------------------


def _graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N - 1, (2, 40), generator=g)  # node N-1 stays isolated
    ew = torch.rand(40, generator=g) + 0.1
    x = torch.randn(N, FIN, generator=g)
    return x, ei, ew


def _gcn_pair(seed=0, cin=FIN, cout=FOUT):
    """A stock GCNConv and ours with the same weights (separate parameters)."""
    torch.manual_seed(seed)
    stock = StockGCN(cin, cout)
    ours = GCNConv(cin, cout)
    ours.load_state_dict(stock.state_dict())
    return stock, ours


def _bw_rows(s):
    return [r for r in s.rows if r.phase == "backward"]


def _fw_rows(s):
    return [r for r in s.rows if r.phase == "forward"]


def _rel(name, prefix):
    """``name`` relative to the region ``prefix`` (``None`` when it is not below it)."""
    return name[len(prefix) + 1 :] if name.startswith(prefix + "/") else None


def _kids(s, r):
    """The rows directly below row ``r``: same phase below a step, any phase below a region
    (backward rows nest under the user's region); when grouped by layer, the same scope
    below a scoped row."""
    out = []
    for k in s.rows:
        if k.parent != r.name:
            continue
        if r.kind != "region" and k.phase != r.phase:
            continue
        if r.scope is not None and k.scope != r.scope:
            continue
        out.append(k)
    return out


def _assert_fractions_add_up(s):
    """Top-level fractions sum to 1; every row's fraction = self + children's fractions."""
    assert sum(r.fraction for r in s.rows if r.depth == 0) == pytest.approx(1.0)
    for r in s.rows:
        kids = _kids(s, r)
        assert r.fraction == pytest.approx(
            r.self_fraction + sum(k.fraction for k in kids), abs=1e-12
        ), r.name
        assert r.self_time == pytest.approx(r.total - sum(k.total for k in kids), abs=1e-12), r.name


def _assert_same_grads(stock, ours):
    """The gradients (None where stock has none) are bit-identical to stock's."""
    for a, b in zip(stock, ours):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a, rtol=0, atol=0)


def _live_tasks():
    """The backward module's set of live graph tasks."""
    return _bw.live


def _records_alive(name):
    """How many backward records of instrumented_convs.core.backward.hooks exist right now for steps
    called ``name`` (other tests' graphs may live on in pytest's tracebacks)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, _bw.Record) and o.name == name)


# -- 1. PyG GCNConv, every input kind ---------------------------------------------------------

GCN_KINDS = [
    "edge_index",
    "edge_weight",
    "edge_weight_grad",
    pytest.param("sparse_tensor", marks=pytest.mark.sparse),
    "torch_coo",
    "torch_csr",
]


def _gcn_adjacency(kind, ei, ew):
    """(adjacency, edge_weight) arguments for ``kind``; ``ew`` may require grad."""
    if kind == "edge_index":
        return ei, None
    if kind in ("edge_weight", "edge_weight_grad"):
        return ei, ew
    if kind == "sparse_tensor":
        if not WITH_TORCH_SPARSE:
            pytest.fail("a test that builds a SparseTensor must carry the sparse mark")
        return SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(N, N)), None
    coo = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.size(1)), (N, N)).coalesce()
    return (coo if kind == "torch_coo" else coo.to_sparse_csr()), None


@needs_pyg
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", GCN_KINDS)
def test_gcn_backward_rows_mirror_forward_and_gradients_match_stock(kind):
    """Every differentiable step of GCNConv gets a backward row at its forward path (relative
    to the regions); gcn_norm only when the edge weights need a gradient; and the gradients
    are exactly the stock layer's."""
    stock, ours = _gcn_pair()
    x0, ei, ew0 = _graph()
    grads = []
    for layer in (stock, ours):
        x = x0.clone().requires_grad_()
        ew = ew0.clone().requires_grad_(kind == "edge_weight_grad")
        adj, w = _gcn_adjacency(kind, ei, ew)
        with region("forward"):
            out = layer(x, adj, w)
        with region("backward"):
            out.pow(2).sum().backward()
        grads.append([x.grad, ew.grad] + [p.grad for p in layer.parameters()])
    _assert_same_grads(*grads)
    s = registry.summary()
    fwd = {_rel(r.name, "forward") for r in _fw_rows(s)} - {None}
    bwd = [_rel(r.name, "backward") for r in _bw_rows(s)]
    assert None not in bwd, "a backward row outside the backward region"
    assert set(bwd) <= fwd, set(bwd) - fwd
    inner = (
        ["GCNConv/propagate/message", "GCNConv/propagate/aggregate"]
        if kind.startswith("edge")
        else ["GCNConv/propagate/message_and_aggregate"]
    )
    expected = {"GCNConv", "GCNConv/lin", "GCNConv/propagate", "GCNConv/bias", *inner}
    assert expected <= set(bwd), expected - set(bwd)
    norm = {b for b in bwd if b.startswith("GCNConv/gcn_norm")}
    if kind == "edge_weight_grad":
        assert "GCNConv/gcn_norm" in norm
    else:
        assert not norm, f"gcn_norm has no gradient to compute here: {norm}"
    assert all(r.count == 1 and r.errors == 0 and r.untimed == 0 for r in _bw_rows(s))
    # regions have no backward: every backward row is a step's
    assert all(r.kind == "step" for r in _bw_rows(s))


# -- 2. DGL GraphConv and EdgeWeightNorm -------------------------------------------------------


def _dgl():
    return pytest.importorskip("dgl")


def _dgl_graph():
    dgl = _dgl()
    g = torch.Generator().manual_seed(0)
    src = torch.cat([torch.randint(0, 9, (30,), generator=g), torch.arange(9).roll(1)])
    dst = torch.cat([torch.randint(0, 9, (30,), generator=g), torch.arange(9)])
    return dgl.graph((src, dst), num_nodes=9)


#: Steps whose outputs never need a gradient (degrees, their powers, checks).
NON_DIFFERENTIABLE = {
    "zero_in_degree_check",
    "degrees",
    "pow",
    "positivity_check",
    "init_weights",
    "edge_weight",
    "local_scope",
    "local_scope_exit",
}


def _mirror_check(s):
    """Backward paths == forward paths of the differentiable steps (regions stripped)."""
    fwd = {_rel(r.name, "forward") for r in _fw_rows(s)} - {None}
    bwd = [_rel(r.name, "backward") for r in _bw_rows(s)]
    assert None not in bwd, "a backward row outside the backward region"
    differentiable = {p for p in fwd if p.rsplit("/", 1)[-1] not in NON_DIFFERENTIABLE}
    assert set(bwd) == differentiable, set(bwd) ^ differentiable
    assert len(bwd) == len(set(bwd))


EXTRAS = {
    "bias": dict(bias=True, activation=None, edge_weight=False),
    "act_ew": dict(bias=False, activation=torch.relu, edge_weight=True),
    "bias_act_ew": dict(bias=True, activation=torch.tanh, edge_weight=True),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("dims", [(6, 4), (4, 6)], ids=["W_first", "aggregate_first"])
@pytest.mark.parametrize("weight", ["module", "external"])
@pytest.mark.parametrize("norm", ["both", "left", "right", "none"])
def test_graphconv_backward_rows_mirror_forward_and_gradients_match_stock(
    norm, weight, dims, extra
):
    """GraphConv's differentiable steps (not degrees/pow/checks) each get one backward row at
    their forward path, and every gradient equals dgl.nn.GraphConv's."""
    _dgl()
    from dgl.nn import GraphConv as Stock

    from instrumented_convs.dgl import GraphConv

    opts = EXTRAS[extra]
    graph = _dgl_graph()
    fin, fout = dims
    torch.manual_seed(0)
    kwargs = dict(
        norm=norm, weight=weight == "module", bias=opts["bias"], activation=opts["activation"]
    )
    stock = Stock(fin, fout, **kwargs)
    ours = GraphConv(fin, fout, **kwargs)
    ours.load_state_dict(stock.state_dict())
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(9, fin, generator=g)
    w0 = torch.randn(fin, fout, generator=g)
    ew0 = torch.rand(graph.num_edges(), generator=g) + 0.1
    grads = []
    for layer in (stock, ours):
        x = x0.clone().requires_grad_()
        w = w0.clone().requires_grad_() if weight == "external" else None
        ew = ew0.clone().requires_grad_() if opts["edge_weight"] else None
        with region("forward"):
            out = layer(graph, x, weight=w, edge_weight=ew)
        with region("backward"):
            out.pow(2).sum().backward()
        grads.append(
            [x.grad, None if w is None else w.grad, None if ew is None else ew.grad]
            + [p.grad for p in layer.parameters()]
        )
    _assert_same_grads(*grads)
    s = registry.summary()
    _mirror_check(s)
    bwd = {_rel(r.name, "backward") for r in _bw_rows(s)}
    assert {"GraphConv", "GraphConv/update_all", "GraphConv/matmul"} <= bwd
    assert ("GraphConv/bias" in bwd) == opts["bias"]
    assert ("GraphConv/activation" in bwd) == (opts["activation"] is not None)
    assert ("GraphConv/norm_src/mul" in bwd) == (norm in ("both", "left"))
    assert ("GraphConv/norm_dst/mul" in bwd) == (norm in ("both", "right"))
    assert all(r.count == 1 and r.errors == 0 and r.untimed == 0 for r in _bw_rows(s))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("norm", ["both", "left", "right", "none"])
def test_edge_weight_norm_backward_with_weights_requiring_grad(norm):
    """EdgeWeightNorm's steps get backward rows when the edge weights need a gradient, and
    the edge-weight gradient through EdgeWeightNorm + GraphConv equals stock's."""
    _dgl()
    from dgl.nn import EdgeWeightNorm as StockEWN
    from dgl.nn import GraphConv as Stock

    from instrumented_convs.dgl import EdgeWeightNorm, GraphConv

    graph = _dgl_graph()
    torch.manual_seed(0)
    stock_conv = Stock(FIN, 4, norm="none")
    ours_conv = GraphConv.from_stock(stock_conv)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, FIN, generator=g)
    ew0 = torch.rand(graph.num_edges(), generator=g) + 0.1
    grads = []
    for ewn, conv in ((StockEWN(norm=norm), stock_conv), (EdgeWeightNorm(norm=norm), ours_conv)):
        ew = ew0.clone().requires_grad_()
        with region("forward"):
            out = conv(graph, x, edge_weight=ewn(graph, ew))
        with region("backward"):
            out.sum().backward()
        grads.append(ew.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
    s = registry.summary()
    _mirror_check(s)
    bwd = {_rel(r.name, "backward") for r in _bw_rows(s)}
    assert {"EdgeWeightNorm", "EdgeWeightNorm/apply_edges", "GraphConv"} <= bwd
    assert ("EdgeWeightNorm/in_weight" in bwd) == (norm != "none")
    assert ("EdgeWeightNorm/out_weight" in bwd) == (norm == "both")


# -- 3. nesting and fractions ------------------------------------------------------------------


class Net(torch.nn.Module):
    """Two GCNConv layers (ours or stock)."""

    def __init__(self, conv_cls):
        super().__init__()
        self.convs = torch.nn.ModuleList([conv_cls(FIN, 8), conv_cls(8, 3)])

    def forward(self, x, ei):
        return self.convs[1](F.relu(self.convs[0](x, ei)), ei)


@needs_pyg
@pytest.mark.parametrize("with_region", [True, False], ids=["region", "top_level"])
def test_backward_rows_nest_under_the_open_region_and_fractions_add_up(with_region):
    """Backward rows go inside the user's region("backward") (whose self time is what its
    children do not cover) or to the top level; fractions add up at every row, merged and
    grouped by layer, where each layer instance has one backward row of its own scope."""
    torch.manual_seed(0)
    model = Net(GCNConv)
    ic.name_layers(model)
    x0, ei, _ = _graph()
    for _ in range(3):
        x = x0.clone().requires_grad_()
        with region("forward"):
            loss = model(x, ei).sum()
        if with_region:
            with region("backward"):
                loss.backward()
        else:
            loss.backward()
    s = registry.summary()
    bw = _bw_rows(s)
    assert bw
    top = "backward/GCNConv" if with_region else "GCNConv"
    assert [r.name for r in bw if r.step == "GCNConv"] == [top]
    if with_region:
        assert all(r.name.startswith("backward/") for r in bw)
        reg = s["backward"]
        assert reg.kind == "region" and reg.phase == "forward" and reg.count == 3
        kids = _kids(s, reg)
        assert [k.name for k in kids] == ["backward/GCNConv"] and kids[0].phase == "backward"
        assert reg.self_time == pytest.approx(reg.total - kids[0].total, abs=1e-12)
        assert 0 <= reg.self_time <= reg.total
    else:
        assert [r.name for r in s.rows if r.depth == 0] == ["forward", "GCNConv"]
        assert [r for r in s.rows if r.name == "GCNConv"][0].phase == "backward"
    row = [r for r in bw if r.name == top][0]
    assert row.count == 6 and row.depth == (1 if with_region else 0)
    _assert_fractions_add_up(s)
    by_layer = registry.summary(by="layer")
    _assert_fractions_add_up(by_layer)
    layer_rows = [r for r in _bw_rows(by_layer) if r.step == "GCNConv"]
    assert sorted(r.scope for r in layer_rows) == ["convs.0", "convs.1"]
    assert all(r.count == 3 and r.name == top for r in layer_rows)
    lins = [r for r in _bw_rows(by_layer) if r.step == "lin"]
    assert sorted(r.scope for r in lins) == ["convs.0", "convs.1"]


# -- 4. exact times ----------------------------------------------------------------------------


def test_fake_clock_gives_exact_backward_times(clock):
    """The backward row of @step("a") nested in @step("outer") times exactly a's backward
    nodes; the outer includes the inner and its own node; the region holds both."""

    @step("a")
    def a(v):
        return Advance.apply(v, clock, 100)

    @step("outer")
    def outer(v):
        v = Advance.apply(v, clock, 10)
        return Advance.apply(a(v), clock, 1000)

    for _ in range(2):
        x = torch.randn(3, requires_grad=True)
        with region("forward"):
            y = outer(x)
        with region("backward"):
            y.sum().backward()
        torch.testing.assert_close(x.grad, torch.ones(3))
    s = registry.summary()
    inner = [r for r in s.rows if r.name == "backward/outer/a" and r.phase == "backward"]
    out = [r for r in s.rows if r.name == "backward/outer" and r.phase == "backward"]
    assert len(inner) == 1 and len(out) == 1
    assert inner[0].count == 2 and inner[0].total == pytest.approx(200 * SEC)
    assert inner[0].min == inner[0].max == pytest.approx(100 * SEC)
    assert out[0].count == 2 and out[0].total == pytest.approx(2 * 1110 * SEC)
    assert out[0].self_time == pytest.approx(2 * 1010 * SEC)
    assert s["backward"].total == pytest.approx(2 * 1110 * SEC)
    assert s["backward"].self_time == pytest.approx(0.0, abs=1e-15)
    assert s["forward/outer"].total == 0.0  # the forward took no fake time


# -- 5. autograd's corners ---------------------------------------------------------------------


@needs_pyg
def test_retain_graph_counts_each_backward_pass():
    """Two backward passes over one retained graph: every backward row counts 2."""
    _, ours = _gcn_pair()
    x0, ei, _ = _graph()
    out = ours(x0.clone().requires_grad_(), ei)
    out.sum().backward(retain_graph=True)
    out.sum().backward()
    bw = _bw_rows(registry.summary())
    assert {r.step for r in bw} >= {"GCNConv", "lin", "propagate", "bias"}
    assert all(r.count == 2 and r.untimed == 0 and r.errors == 0 for r in bw)


@needs_pyg
def test_autograd_grad_matches_stock_and_leaves_clean_state():
    """autograd.grad (which prunes the weight branch) gives stock's result; each step's
    call is accounted once, timed or untimed; the next ordinary pass records normally."""
    stock, ours = _gcn_pair()
    x0, ei, _ = _graph()
    res = []
    for layer in (stock, ours):
        x = x0.clone().requires_grad_()
        res.append(torch.autograd.grad(layer(x, ei).sum(), [x])[0])
    torch.testing.assert_close(res[1], res[0], rtol=0, atol=0)
    assert depth() == 0
    s = registry.summary()
    bw = _bw_rows(s)
    assert bw and all(r.count + r.untimed == 1 and r.errors == 0 for r in bw)
    # the layer's last node (the weight's transpose) is pruned: its call ends with the last
    # of its steps that ran, timed, its steps inside it
    layer = [r for r in bw if r.name == "GCNConv"][0]
    assert layer.count == 1 and layer.untimed == 0 and layer.self_time >= 0
    registry.reset()
    x = x0.clone().requires_grad_()
    with region("forward"):
        out = ours(x, ei)
    with region("backward"):
        out.sum().backward()
    assert depth() == 0
    bw = _bw_rows(registry.summary())
    assert {r.name for r in bw} >= {"backward/GCNConv", "backward/GCNConv/lin"}
    assert all(r.count == 1 and r.untimed == 0 and r.errors == 0 for r in bw)


@needs_pyg
def test_double_backward_matches_stock():
    """create_graph=True then a backward of the gradient: first- and second-order gradients
    equal the stock layer's, and no step stays open."""
    stock, ours = _gcn_pair()
    x0, ei, _ = _graph()
    res = []
    for layer in (stock, ours):
        x = x0.clone().requires_grad_()
        (gx,) = torch.autograd.grad(layer(x, ei).pow(2).sum(), [x], create_graph=True)
        gx.pow(2).sum().backward()
        res.append([gx.detach(), x.grad] + [p.grad for p in layer.parameters()])
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert depth() == 0
    s = registry.summary()
    assert {r.count for r in s if r.phase == "forward"} == {1}
    # two passes over each step: the gradient's, then the gradient of it; the first (taken
    # for x alone) prunes the weight's branch, so lin's call there is untimed
    bw = {r.name: (r.count, r.untimed, r.errors) for r in _bw_rows(s)}
    steps = ("", "/bias", "/propagate", "/propagate/aggregate", "/propagate/collect",
             "/propagate/message")  # fmt: skip
    assert bw == {"GCNConv/lin": (1, 1, 0), **{f"GCNConv{k}": (2, 0, 0) for k in steps}}


@needs_pyg
def test_outputs_without_grad_record_no_backward():
    """Frozen parameters and an input without grad: nothing to hook, no backward rows."""
    _, ours = _gcn_pair()
    for p in ours.parameters():
        p.requires_grad_(False)
    x, ei, _ = _graph()
    out = ours(x, ei)
    assert not out.requires_grad
    s = registry.summary()
    assert s["GCNConv"].count == 1 and not _bw_rows(s)


@needs_pyg
@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_no_grad_and_inference_mode_record_forward_only(ctx):
    """Under no_grad / inference_mode the forward rows are there, backward rows never."""
    _, ours = _gcn_pair()
    x, ei, _ = _graph()
    with ctx():
        ours(x.requires_grad_(), ei)
    s = registry.summary()
    assert s["GCNConv"].count == 1 and s["GCNConv/lin"].count == 1
    assert not _bw_rows(s)


# -- 6. a backward that raises -----------------------------------------------------------------


class Boom(torch.autograd.Function):
    """Identity whose backward raises ``ERR``."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise ERR


ERR = RuntimeError("boom in backward")


@needs_pyg
@pytest.mark.parametrize("with_region", [True, False], ids=["region", "top_level"])
def test_backward_that_raises_propagates_and_leaves_balanced_stacks(with_region):
    """Boom raises after the @step("block")'s backward has started (its first node): the
    exception is the same object, the stacks are balanced at once (with or without a
    region), the next pass records at the top level, and block's backward row shows the
    error."""
    _, ours = _gcn_pair()
    x0, ei, _ = _graph()

    @step("block")
    def block(v):
        return Boom.apply(ours(v, ei))

    x = x0.clone().requires_grad_()
    out = block(x)
    with pytest.raises(RuntimeError) as info:
        if with_region:
            with region("backward"):
                out.sum().backward()
        else:
            out.sum().backward()
    assert info.value is ERR
    # closed at once: by the region's exit, or when the dead graph task was freed
    assert depth() == 0, open_steps()
    del out
    # the next forward+backward records normally, at the top level
    x = x0.clone().requires_grad_()
    ours(x, ei).sum().backward()
    assert depth() == 0, open_steps()
    s = registry.summary()
    raised = [r for r in _bw_rows(s) if r.step == "block"]
    assert len(raised) == 1 and raised[0].errors >= 1 and raised[0].count == 0
    assert raised[0].name == ("backward/block" if with_region else "block")
    gcn = [r for r in _bw_rows(s) if r.name == "GCNConv"]
    assert len(gcn) == 1 and gcn[0].count == 1 and gcn[0].errors == 0
    assert not any(r.name.startswith("block/") for r in _bw_rows(s)), "nested under a dead frame"
    torch.testing.assert_close(x.grad, _stock_grad(ours, x0, ei))


def _stock_grad(ours, x0, ei):
    stock = ours.to_stock()
    x = x0.clone().requires_grad_()
    stock(x, ei).sum().backward()
    return x.grad


# -- 7. activation checkpointing ---------------------------------------------------------------


@needs_pyg
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_checkpoint_runs_and_matches_stock(reentrant):
    """torch.utils.checkpoint around our layer: gradients equal the plain stock layer's and
    the layer's backward is recorded."""
    stock, ours = _gcn_pair()
    x0, ei, _ = _graph()
    xs = x0.clone().requires_grad_()
    stock(xs, ei).pow(2).sum().backward()
    x = x0.clone().requires_grad_()
    with region("forward"):
        out = checkpoint(ours, x, ei, use_reentrant=reentrant)
    with region("backward"):
        out.pow(2).sum().backward()
    assert depth() == 0
    torch.testing.assert_close(x.grad, xs.grad, rtol=0, atol=0)
    for a, b in zip(stock.parameters(), ours.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0)
    bw = _bw_rows(registry.summary())
    assert any(r.step == "GCNConv" and r.count == 1 for r in bw)
    assert any(r.step == "lin" for r in bw)


# -- 8. memory ---------------------------------------------------------------------------------


def test_memory_stays_flat_over_1e5_backward_steps():
    """10^5 forward+backward of a tiny @step function leave nothing behind: Python memory
    flat between 10^4 and 10^5 iterations, no graph task left live, no records piling up.

    SLOW: the slowest test of the file, about 15-30 s on two slow cores. tracemalloc makes
    each iteration 4-7x slower (10^5 traced iterations take minutes here), so it traces a
    window of 5000 iterations (after a burn-in that fills free lists), and the whole
    10^4 -> 10^5 span is checked with sys.getallocatedblocks(), which costs nothing: a leak
    of one object per iteration would add ~90000 blocks.
    """
    a = torch.tensor(2.0, requires_grad=True)

    @step("tiny")
    def tiny(v):
        return v * 3.0 + 1.0

    # while a graph lives, its record exists (so the record checks here can fail)
    kept = tiny(a)
    assert _records_alive("tiny") == 1
    del kept
    assert _records_alive("tiny") == 0

    def run(n):
        for _ in range(n):
            tiny(a).backward()

    run(10_000)
    gc.collect()
    blocks_1e4 = sys.getallocatedblocks()
    tracemalloc.start()
    try:
        run(2_000)  # burn-in: free lists of hook tuples etc. fill up (~9 KiB, once)
        gc.collect()
        traced_start = tracemalloc.get_traced_memory()[0]
        run(3_000)
        gc.collect()
        traced_grown = tracemalloc.get_traced_memory()[0] - traced_start
    finally:
        tracemalloc.stop()
    run(85_000)
    gc.collect()
    blocks_grown = sys.getallocatedblocks() - blocks_1e4
    s = registry.summary()
    assert [(r.name, r.phase, r.count) for r in s] == [
        ("tiny", "forward", 100_001),
        ("tiny", "backward", 100_000),
    ]
    assert a.grad == pytest.approx(3.0 * 100_000)
    assert traced_grown < 16 * 1024, f"grew by {traced_grown} bytes over 3000 iterations"
    assert blocks_grown < 1000, f"{blocks_grown} more memory blocks after 9*10^4 iterations"
    assert not _live_tasks()
    assert _records_alive("tiny") == 0


def test_no_backward_record_outlives_its_graph():
    """Records are referenced by the hooks only, so they die with the autograd graph."""
    a = torch.tensor(2.0, requires_grad=True)

    @step("lonely")
    def lonely(v):
        return v * 3.0

    lonely(a).backward()  # the graph is freed by the end of this line
    assert _records_alive("lonely") == 0


# -- 9. threads --------------------------------------------------------------------------------


@needs_pyg
def test_threads_record_their_own_backward_under_their_own_region():
    """Two threads, each with its own layer and region: exact per-layer counts in both
    phases, and each thread's backward rows only under its own region."""
    iters = 15
    layers = [GCNConv(FIN, FOUT), GCNConv(FIN, FOUT)]
    layers[0].scope, layers[1].scope = "left", "right"
    x0, ei, _ = _graph()
    barrier = threading.Barrier(2)
    errors = []

    def worker(i):
        try:
            barrier.wait()
            for _ in range(iters):
                with region(f"thread{i}"):
                    out = layers[i](x0.clone().requires_grad_(), ei)
                    out.sum().backward()
            assert depth() == 0
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    s = registry.summary(by="layer")
    for i, scope in enumerate(("left", "right")):
        rows = [r for r in s.rows if r.scope == scope]
        assert rows and all(r.name.startswith(f"thread{i}/") for r in rows), [
            r.name for r in rows if not r.name.startswith(f"thread{i}/")
        ]
        for phase in ("forward", "backward"):
            conv = [r for r in rows if r.step == "GCNConv" and r.phase == phase]
            assert len(conv) == 1 and conv[0].count == iters, (phase, conv)
            lin = [r for r in rows if r.step == "lin" and r.phase == phase]
            assert len(lin) == 1 and lin[0].count == iters
    assert s["thread0"].count == iters and s["thread1"].count == iters
    assert not any("thread0" in r.name and "thread1" in r.name for r in s.rows)


# -- 10. switches and the profiler ---------------------------------------------------------------


@needs_pyg
def test_configure_backward_false_records_none_even_for_hooks_set_before():
    """configure(backward=False): no backward rows, also from a graph hooked before."""
    _, ours = _gcn_pair()
    x0, ei, _ = _graph()
    hooked = ours(x0.clone().requires_grad_(), ei)  # hooks set up while backward is on
    ic.configure(backward=False)
    assert not ic.configure().backward
    hooked.sum().backward()
    ours(x0.clone().requires_grad_(), ei).sum().backward()
    s = registry.summary()
    assert s["GCNConv"].count == 2 and not _bw_rows(s)
    ic.configure(backward=True)  # back on: the next pass records again
    ours(x0.clone().requires_grad_(), ei).sum().backward()
    assert [r.count for r in _bw_rows(registry.summary()) if r.name == "GCNConv"] == [1]


def test_env_var_turns_backward_off_at_import():
    """INSTRUMENTED_CONVS_BACKWARD=0 in a fresh interpreter: forward rows, no backward ones."""
    code = (
        "import torch, instrumented_convs as ic\n"
        "from instrumented_convs.layers import step\n"
        "w = torch.ones(3, requires_grad=True)\n"
        "@step('f')\n"
        "def f(v):\n"
        "    return (v * 2).sum()\n"
        "f(w).backward()\n"
        "with step('user'):\n"
        "    y = (w * 3).sum()\n"
        "y.backward()\n"
        "print(ic.configure().backward, sorted((r.name, r.phase) for r in ic.registry.summary()))\n"
    )
    out = run_script("-c", code, env={"INSTRUMENTED_CONVS_BACKWARD": "0"}).stdout.strip()
    assert out == "False [('f', 'forward'), ('user', 'forward')]"


@needs_pyg
def test_disable_records_nothing_even_for_hooks_set_before():
    """ic.configure(enabled=False): nothing at all, also from a graph hooked while enabled."""
    _, ours = _gcn_pair()
    x0, ei, _ = _graph()
    hooked = ours(x0.clone().requires_grad_(), ei)
    registry.reset()
    ic.configure(enabled=False)
    try:
        hooked.sum().backward()
        ours(x0.clone().requires_grad_(), ei).sum().backward()
    finally:
        ic.configure(enabled=True)
    assert len(registry.summary()) == 0


@needs_pyg
def test_profiler_shows_backward_labels():
    """torch.profiler (CPU) during a forward+backward shows "<step> [backward]" events."""
    _, ours = _gcn_pair()
    x, ei, _ = _graph()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ours(x.requires_grad_(), ei).sum().backward()
    names = {e.name for e in prof.events()}
    assert {"GCNConv [backward]", "propagate [backward]", "GCNConv", "propagate"} <= names


# -- 11. user steps --------------------------------------------------------------------------


def test_with_block_and_decorated_function_get_backward_rows():
    """A top-level ``with step("user")`` block that marks its result and a decorated
    ``@step("head")`` function each get one backward row; a block that marks nothing gets
    none (its outputs are never guessed from the caller's variables)."""
    from instrumented_convs.layers import mark_outputs

    x = torch.randn(4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    with step("user"):
        y = mark_outputs((x * w).sum())
    y.backward()
    with step("unmarked"):
        z = (x * w).sum()
    z.backward()

    @step("head")
    def head(v):
        return (v * w).sum()

    head(x).backward()
    s = registry.summary()
    assert sorted((r.name, r.phase, r.count) for r in s) == [
        ("head", "backward", 1),
        ("head", "forward", 1),
        ("unmarked", "forward", 1),
        ("user", "backward", 1),
        ("user", "forward", 1),
    ]
    torch.testing.assert_close(x.grad, 3 * w.detach())


def test_an_unmarked_block_gets_the_backward_of_what_nested_steps_marked():
    """A ``with step()`` block that marks nothing still gets backward rows for the steps
    nested in it that did mark theirs (a layer inside a user's step)."""
    from instrumented_convs.layers import mark_outputs

    x = torch.randn(4, requires_grad=True)
    with step("outer"):
        with step("inner"):
            h = mark_outputs(x * 2)
        y = (h * 3).sum()
    y.backward()
    rows = {(r.name, r.phase) for r in registry.summary()}
    assert ("inner", "backward") in rows  # (the backward of a step whose parent has none)
    assert not {name for name, phase in rows if phase == "backward" and name.startswith("outer")}


# -- 12. the Summary API with phases ------------------------------------------------------------


def _mixed_summary():
    _, ours = _gcn_pair()
    x, ei, _ = _graph()
    with region("forward"):
        out = ours(x.requires_grad_(), ei)
    with region("backward"):
        out.sum().backward()
    return registry.summary()


@needs_pyg
def test_select_by_phase():
    """select(phase=...) keeps one phase (fractions still of the whole), rejects others."""
    s = _mixed_summary()
    back = s.select(phase="backward")
    assert back.rows == _bw_rows(s) and back.rows
    assert back.total == s.total
    fwd = s.select(phase="forward")
    assert fwd.rows == _fw_rows(s) and "backward" in fwd  # the region is a forward row
    assert s.select(prefix="backward/GCNConv", phase="backward").rows == back.rows
    assert s.select().rows == s.rows
    with pytest.raises(ValueError):
        s.select(phase="bogus")
    assert "[backward]" in str(s) and "[backward]" not in str(fwd)


@needs_pyg
def test_serialisation_keeps_phase_and_reads_files_without_it():
    """JSON, CSV and DataFrame round trips keep ``phase``; files written before the field
    existed still load, every row a forward row."""
    s = _mixed_summary()
    assert Summary.from_json(s.to_json()) == s
    csv_back = Summary.from_csv(s.to_csv(), total=s.total)
    assert [r.phase for r in csv_back] == [r.phase for r in s]
    assert [r.name for r in csv_back] == [r.name for r in s]
    df_back = Summary.from_dataframe(s.to_dataframe(), total=s.total)
    assert [(r.name, r.phase) for r in df_back] == [(r.name, r.phase) for r in s]
    assert {r.phase for r in s} == {"forward", "backward"}
    # older files: no phase field
    data = json.loads(s.to_json())
    for row in data["rows"]:
        del row["phase"]
    old = Summary.from_json(json.dumps(data))
    assert [r.name for r in old] == [r.name for r in s] and {r.phase for r in old} == {"forward"}
    lines = s.to_csv().splitlines()
    header = lines[0].split(",")
    i = header.index("phase")
    stripped = "\n".join(
        ",".join(c for j, c in enumerate(line.split(",")) if j != i) for line in lines
    )
    old_csv = Summary.from_csv(stripped + "\n")
    assert [r.name for r in old_csv] == [r.name for r in s] and {r.phase for r in old_csv} == {
        "forward"
    }
    old_df = Summary.from_dataframe(s.to_dataframe().drop(columns=["phase"]))
    assert len(old_df) == len(s) and {r.phase for r in old_df} == {"forward"}


def test_closing_frames_above_a_step_not_on_this_stack_closes_nothing():
    """A step exited on a thread where it was never entered must not close that thread's
    live backward frames (close_above only closes what lies above the step's own frame)."""
    from instrumented_convs.core.frames.stack import Frame, thread_stack

    stack = thread_stack()
    frame = Frame()
    frame.task = -7  # a backward frame of some running graph task
    stack.append(frame)
    try:
        _bw.close_above(stack, object())
        assert stack[-1] is frame
    finally:
        stack.remove(frame)


def _two_outputs(x, w, used_first):
    """A step ``outer`` with two steps inside, each making one of its two outputs; the one
    the next layer uses is made first (``used_first``) or second."""
    from instrumented_convs.layers import mark_outputs

    with step("outer"):
        outs = []
        for name in ("a", "b"):
            with step(name):
                outs.append(mark_outputs(x * w))
        mark_outputs(tuple(outs))
    return outs[0] if used_first else outs[1]


@pytest.mark.parametrize("used_first", [True, False], ids=["first-node-pruned", "last-pruned"])
def test_a_backward_run_in_part_is_timed_and_nests_no_later_step(used_first):
    """Autograd skips the nodes of an output the loss does not use (a heterogeneous layer's
    relation): the step's backward opens with the first of its steps that runs, and ends
    when a step outside it begins (or with the last of its steps at the pass's end), so the
    layer before it is not nested inside it and no call goes untimed."""
    w1, w2 = (torch.randn(4, requires_grad=True) for _ in range(2))
    registry.reset()
    for _ in range(3):
        with region("backward"):
            h = _two_outputs(torch.randn(4), w1, used_first)
            _two_outputs(h, w2, used_first).sum().backward()
    rows = {r.name: r for r in registry.summary().rows if r.phase == "backward"}
    assert rows["backward/outer"].count == 6 and rows["backward/outer"].untimed == 0, rows
    assert not [n for n in rows if n.count("outer") > 1]  # the first layer beside, not inside
    kept = "a" if used_first else "b"
    assert rows[f"backward/outer/{kept}"].count == 6
    assert rows["backward/outer"].self_time >= 0
    assert depth() == 0


def test_counted_calls_after_a_backward_run_in_part_are_beside_it():
    """Past the census most calls are counted, their count hook on the anchor's output: a
    step whose backward autograd ran in part (its first output unused) has ended by then,
    so the counted layer's rows are beside it, not nested in it; every call is counted."""

    w1, w2 = (torch.randn(4, requires_grad=True) for _ in range(2))

    @step("single")
    def single(v):
        return v * w1

    registry.reset()
    for _ in range(40):
        with region("backward"):
            _two_outputs(single(torch.randn(4)), w2, used_first=False).sum().backward()
    rows = {r.name: r for r in registry.summary().rows if r.phase == "backward"}
    assert rows["backward/single"].count == 40 and rows["backward/single"].estimated > 0
    assert rows["backward/outer"].count == 40 and rows["backward/outer"].untimed == 0
    assert not [n for n in rows if "outer/single" in n]
    assert depth() == 0
