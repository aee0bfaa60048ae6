"""instrumented_convs.dgl.GraphConv / EdgeWeightNorm against the real dgl.nn layers."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("DGLBACKEND", "pytorch")
dgl = pytest.importorskip("dgl")
from dgl.base import DGLError  # noqa: E402
from dgl.nn import EdgeWeightNorm as StockEWN  # noqa: E402
from dgl.nn import GraphConv as Stock  # noqa: E402

from instrumented_convs import configure, region, registry  # noqa: E402
from instrumented_convs.commands.check import PASS, SKIPPED  # noqa: E402
from instrumented_convs.commands.check._cases import cases as check_cases  # noqa: E402
from instrumented_convs.commands.check.equivalence import run_case  # noqa: E402
from instrumented_convs.dgl import EdgeWeightNorm, GraphConv  # noqa: E402
from instrumented_convs.testing import depth  # noqa: E402

from .helpers import gpu, train_losses  # noqa: E402
from .helpers import outcome as _outcome  # noqa: E402

N_SRC, N_DST = 9, 7


def _homogeneous(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N_SRC, (30,), generator=g)
    dst = torch.randint(0, N_SRC, (30,), generator=g)
    # every node gets an in-edge, so allow_zero_in_degree=False passes
    src = torch.cat([src, torch.arange(N_SRC).roll(1)])
    dst = torch.cat([dst, torch.arange(N_SRC)])
    return dgl.graph((src, dst), num_nodes=N_SRC)


def _bipartite(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.cat([torch.randint(0, N_SRC, (25,), generator=g), torch.arange(N_DST)])
    dst = torch.cat([torch.randint(0, N_DST, (25,), generator=g), torch.arange(N_DST)])
    return dgl.heterograph(
        {("user", "plays", "game"): (src, dst)}, num_nodes_dict={"user": N_SRC, "game": N_DST}
    )


def _block(seed=0):
    """A block from one step of neighbour sampling (to_block needs every in-edge's
    destination among dst_nodes: a whole graph cut at arbitrary nodes crashes DGL)."""
    dgl.seed(seed)
    seeds = torch.arange(5)
    frontier = dgl.sampling.sample_neighbors(_homogeneous(seed), seeds, 3)
    return dgl.to_block(frontier, dst_nodes=seeds)


def _inputs(kind, fin, seed=0):
    """(graph, features) for a graph kind; features require grad."""
    g = torch.Generator().manual_seed(seed + 1)
    if kind == "homogeneous":
        graph = _homogeneous(seed)
        return graph, torch.randn(N_SRC, fin, generator=g).requires_grad_()
    if kind == "bipartite":
        graph = _bipartite(seed)
        return graph, (
            torch.randn(N_SRC, fin, generator=g).requires_grad_(),
            torch.randn(N_DST, fin, generator=g).requires_grad_(),
        )
    graph = _block(seed)
    return graph, torch.randn(graph.num_src_nodes(), fin, generator=g).requires_grad_()


def _leaves(feat):
    return list(feat) if isinstance(feat, tuple) else [feat]


@pytest.mark.parametrize("kind", ["homogeneous", "bipartite", "block"])
@pytest.mark.parametrize("dims", [(6, 4), (4, 6)], ids=["W_first", "aggregate_first"])
@pytest.mark.parametrize("edge_weight", ["none", "raw", "EdgeWeightNorm"])
@pytest.mark.parametrize("activation", [None, torch.relu], ids=["no_act", "relu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("weight", ["module", "external"])
@pytest.mark.parametrize("norm", ["both", "left", "right", "none"])
@pytest.mark.parametrize("allow_zero", [False, True])
def test_outputs_and_gradients_match_stock(
    kind, dims, edge_weight, activation, bias, weight, norm, allow_zero
):
    fin, fout = dims
    opts = dict(
        norm=norm,
        weight=weight == "module",
        bias=bias,
        activation=activation,
        allow_zero_in_degree=allow_zero,
    )
    torch.manual_seed(0)
    stock = Stock(fin, fout, **opts)
    ours = GraphConv(fin, fout, **opts)
    ours.load_state_dict(stock.state_dict())
    results = []
    for layer, ewn_cls in ((stock, StockEWN), (ours, EdgeWeightNorm)):
        graph, feat = _inputs(kind, fin)
        ext_w = torch.randn(fin, fout, generator=torch.Generator().manual_seed(7)).requires_grad_()
        raw_w = (
            torch.rand(graph.num_edges(), generator=torch.Generator().manual_seed(8)) + 0.1
        ).requires_grad_()

        def forward_backward():
            w = None
            if edge_weight == "raw":
                w = raw_w
            elif edge_weight == "EdgeWeightNorm":
                w = ewn_cls(norm="both")(graph, raw_w)
            out = layer(graph, feat, weight=ext_w if weight == "external" else None, edge_weight=w)
            out.pow(2).sum().backward()
            return out

        out, exc = _outcome(forward_backward)
        grads = (
            [t.grad for t in _leaves(feat)]
            + [ext_w.grad, raw_w.grad]
            + [p.grad for p in layer.parameters()]
        )
        results.append((out, exc, grads))
    (s_out, s_exc, s_grads), (o_out, o_exc, o_grads) = results
    assert s_exc is None, s_exc  # every combination here is valid upstream
    assert o_exc is None, o_exc
    torch.testing.assert_close(o_out, s_out)
    for a, b in zip(s_grads, o_grads):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a)


@pytest.mark.parametrize("norm", ["both", "left", "right", "none"])
@pytest.mark.parametrize("kind", ["homogeneous", "bipartite", "block"])
def test_edge_weight_norm_matches_stock(norm, kind):
    graph, _ = _inputs(kind, 3)
    w0 = torch.rand(graph.num_edges()) + 0.1
    ws, wo = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    s = StockEWN(norm=norm, eps=0.01)(graph, ws)
    o = EdgeWeightNorm(norm=norm, eps=0.01)(graph, wo)
    torch.testing.assert_close(o, s)
    s.sum().backward()
    o.sum().backward()
    torch.testing.assert_close(wo.grad, ws.grad)


def _zero_in_degree_graph():
    return dgl.graph(
        (torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=4
    )  # node 3: no in-edge


def test_zero_in_degree_raises_the_stock_error_and_is_a_step():
    g = _zero_in_degree_graph()
    x = torch.randn(4, 3)
    with pytest.raises(DGLError) as stock_err:
        Stock(3, 2)(g, x)
    with pytest.raises(DGLError) as ours_err:
        GraphConv(3, 2)(g, x)
    assert str(ours_err.value) == str(stock_err.value)
    assert depth() == 0
    s = registry.summary()
    assert s["GraphConv/zero_in_degree_check"].count == 1
    assert s["GraphConv"].errors == 1
    # allowed: same output, and no check step
    registry.reset()
    torch.manual_seed(0)
    stock = Stock(3, 2, allow_zero_in_degree=True)
    ours = GraphConv(3, 2, allow_zero_in_degree=True)
    ours.load_state_dict(stock.state_dict())
    torch.testing.assert_close(ours(g, x), stock(g, x))
    assert "GraphConv/zero_in_degree_check" not in registry.summary()
    # set_allow_zero_in_degree is the stock method
    ours.set_allow_zero_in_degree(False)
    with pytest.raises(DGLError):
        ours(g, x)


@pytest.mark.parametrize(
    "case",
    [
        "external_weight_conflict",
        "edge_weight_shape",
        "wrong_feature_size",
        "edge_weight_2d_norm",
        "non_positive_edge_weight",
    ],
)
def test_bad_input_raises_like_stock_and_leaves_the_stack_balanced(case):
    g = _homogeneous()
    x = torch.randn(N_SRC, 4)
    torch.manual_seed(0)
    stock, ours = Stock(4, 3), GraphConv(4, 3)
    ours.load_state_dict(stock.state_dict())
    ewn = (StockEWN(), EdgeWeightNorm())
    calls = {
        "external_weight_conflict": lambda layer, _: layer(g, x, weight=torch.randn(4, 3)),
        "edge_weight_shape": lambda layer, _: layer(
            g, x, edge_weight=torch.rand(g.num_edges() + 1)
        ),
        "wrong_feature_size": lambda layer, _: layer(g, torch.randn(N_SRC, 5)),
        "edge_weight_2d_norm": lambda _, norm: norm(g, torch.rand(g.num_edges(), 2)),
        "non_positive_edge_weight": lambda _, norm: norm(g, torch.zeros(g.num_edges())),
    }
    _, s_exc = _outcome(lambda: calls[case](stock, ewn[0]))
    _, o_exc = _outcome(lambda: calls[case](ours, ewn[1]))
    assert s_exc is not None and o_exc is not None
    assert type(o_exc) is type(s_exc) and str(o_exc) == str(s_exc)
    assert depth() == 0
    registry.reset()
    ours(g, x)
    assert registry.summary()["GraphConv/update_all"].count == 1


def test_is_a_stock_layer_with_the_same_parameters_repr_and_state_dict():
    torch.manual_seed(3)
    stock = Stock(5, 4, norm="right", activation=torch.relu)
    torch.manual_seed(3)
    ours = GraphConv(5, 4, norm="right", activation=torch.relu)
    assert isinstance(ours, Stock)
    assert repr(ours) == repr(stock) and ours.extra_repr() == stock.extra_repr()
    assert list(ours.state_dict()) == list(stock.state_dict())
    for a, b in zip(stock.parameters(), ours.parameters()):
        assert torch.equal(a, b)
    torch.manual_seed(4)
    other = Stock(5, 4, norm="right")
    ours.load_state_dict(other.state_dict(), strict=True)
    stock.load_state_dict(ours.state_dict(), strict=True)
    assert torch.equal(stock.weight, other.weight)
    torch.manual_seed(5)
    stock.reset_parameters()
    torch.manual_seed(5)
    ours.reset_parameters()
    assert torch.equal(ours.weight, stock.weight)
    with pytest.raises(DGLError) as stock_err:
        Stock(5, 4, norm="bogus")
    with pytest.raises(DGLError) as ours_err:
        GraphConv(5, 4, norm="bogus")
    assert str(ours_err.value) == str(stock_err.value)


def test_to_stock_and_from_stock_share_parameters():
    stock = Stock(4, 3, norm="left")
    ours = GraphConv.from_stock(stock)
    assert ours.weight is stock.weight and ours._norm == "left"
    back = ours.to_stock()
    assert type(back) is Stock and back.bias is stock.bias
    g, x = _homogeneous(), torch.randn(N_SRC, 4)
    torch.testing.assert_close(ours(g, x), stock(g, x))
    torch.testing.assert_close(back(g, x), stock(g, x))


class Net(torch.nn.Module):
    """A 3-layer GCN whose layers take both matmul branches (20>16, 16=16, 16>3)."""

    def __init__(self, conv_cls):
        super().__init__()
        self.convs = torch.nn.ModuleList([conv_cls(20, 16), conv_cls(16, 16), conv_cls(16, 3)])

    def forward(self, g, x):
        for conv in self.convs[:-1]:
            x = F.relu(conv(g, x))
        return F.log_softmax(self.convs[-1](g, x), dim=-1)


def test_three_layer_model_trains_to_identical_losses():
    g = _homogeneous()
    x = torch.randn(N_SRC, 20)
    y = torch.arange(N_SRC) % 3
    losses = []
    for conv_cls in (Stock, GraphConv):
        torch.manual_seed(0)
        losses.append(train_losses(Net(conv_cls), (g, x), y))
    assert losses[0] == losses[1]


def test_steps_of_a_three_layer_model():
    g, x = _homogeneous(), torch.randn(N_SRC, 20)
    model = Net(GraphConv)
    k = 3
    for _ in range(k):
        with region("forward"):
            model(g, x)
    s = registry.summary()
    assert [r.name for r in s] == [
        "forward",
        "forward/GraphConv",
        "forward/GraphConv/local_scope",
        "forward/GraphConv/zero_in_degree_check",
        "forward/GraphConv/norm_src",
        "forward/GraphConv/norm_src/degrees",
        "forward/GraphConv/norm_src/pow",
        "forward/GraphConv/norm_src/mul",
        "forward/GraphConv/matmul",
        "forward/GraphConv/update_all",
        "forward/GraphConv/norm_dst",
        "forward/GraphConv/norm_dst/degrees",
        "forward/GraphConv/norm_dst/pow",
        "forward/GraphConv/norm_dst/mul",
        "forward/GraphConv/bias",
        "forward/GraphConv/local_scope_exit",
    ]
    assert s["forward"].count == k
    assert all(r.count == 3 * k for r in s if r.name != "forward")
    assert all(r.self_time >= 0 for r in s)
    assert len({r.scope for r in registry.summary(by="layer") if r.step == "GraphConv"}) == 3


class AGGNet(torch.nn.Module):
    """Seed 003's aggregation network: 2-hop GraphConv on 1-dimensional ones."""

    def __init__(self, conv_cls, num_hop=2):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [conv_cls(1, 1, allow_zero_in_degree=True) for _ in range(num_hop)]
        )

    def forward(self, graph):
        feat = graph.ndata["feat"]
        for conv in self.convs[:-1]:
            feat = F.dropout(conv(graph, feat), p=0, training=self.training)
        return self.convs[-1](graph, feat)


def test_aggnet_matches_stock_and_records_its_steps():
    g = dgl.graph(
        (torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 3])), num_nodes=5
    )  # 4 has no in-edge
    g.ndata["feat"] = torch.ones(5, 1)
    torch.manual_seed(0)
    stock = AGGNet(Stock)
    ours = AGGNet(GraphConv)
    ours.load_state_dict(stock.state_dict())
    k = 4
    for _ in range(k):
        torch.testing.assert_close(ours(g), stock(g))
    s = registry.summary()
    assert s["GraphConv"].count == 2 * k
    assert s["GraphConv/update_all"].count == 2 * k
    assert "GraphConv/zero_in_degree_check" not in s  # allow_zero_in_degree=True: no check, no copy


def test_edge_weight_steps():
    g, x = _homogeneous(), torch.randn(N_SRC, 4)
    w = torch.rand(g.num_edges()) + 0.1
    conv, norm = GraphConv(4, 3), EdgeWeightNorm(norm="both")
    with region("forward"):
        conv(g, x, edge_weight=norm(g, w))
    names = [r.name for r in registry.summary()]
    assert names[:8] == [
        "forward",
        "forward/EdgeWeightNorm",
        "forward/EdgeWeightNorm/local_scope",
        "forward/EdgeWeightNorm/positivity_check",
        "forward/EdgeWeightNorm/init_weights",
        "forward/EdgeWeightNorm/out_weight",
        "forward/EdgeWeightNorm/in_weight",
        "forward/EdgeWeightNorm/apply_edges",
    ]
    assert "forward/GraphConv/update_all" in names and "forward/GraphConv/edge_weight" in names


def test_disabled_runs_the_stock_code(monkeypatch):
    import instrumented_convs.dgl.graphconv as idgl

    def fail(*a, **k):
        raise AssertionError("instrumented code used while disabled")

    monkeypatch.setattr(idgl, "_instrumented_graph_conv_forward", fail)
    monkeypatch.setattr(idgl, "_instrumented_edge_weight_norm_forward", fail)
    g, x = _homogeneous(), torch.randn(N_SRC, 4)
    torch.manual_seed(0)
    stock, ours = Stock(4, 3), GraphConv(4, 3)
    ours.load_state_dict(stock.state_dict())
    with configure(enabled=False):
        torch.testing.assert_close(ours(g, x), stock(g, x))
        EdgeWeightNorm()(g, torch.rand(g.num_edges()) + 0.1)
    assert len(registry.summary()) == 0
    with pytest.raises(AssertionError, match="while disabled"):
        ours(g, x)
    assert depth() == 0


@gpu
@pytest.mark.parametrize(
    "case", [c for c in check_cases() if c.framework == "dgl"], ids=lambda c: c.name
)
def test_cuda_equivalence_and_event_timing(case):
    """The check's own comparison on the GPU; PyPI's DGL wheels are CPU-only: SKIPPED then."""
    status, detail, _ = run_case(case, torch.device("cuda", 0), 300)
    if status == SKIPPED:
        pytest.skip(detail)
    assert status == PASS, detail


@pytest.mark.parametrize("norm", ["both", "right"])
@pytest.mark.parametrize("bias", [True, False])
def test_autocast_matches_stock_dtype_and_values(norm, bias):
    # under autocast the matmul's output is bf16 while the features stay fp32; upstream
    # converts the destination degrees to the features' dtype, not the matmul's
    g = _homogeneous()
    x = torch.randn(N_SRC, 4)
    torch.manual_seed(0)
    stock, ours = Stock(4, 3, norm=norm, bias=bias), GraphConv(4, 3, norm=norm, bias=bias)
    ours.load_state_dict(stock.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s, o = stock(g, x), ours(g, x)
    assert o.dtype == s.dtype
    torch.testing.assert_close(o, s)


def test_torch_compile_matches_and_breaks_no_more_graphs_than_stock():
    g, x = _homogeneous(), torch.randn(N_SRC, 20)
    torch.manual_seed(0)
    stock_model = Net(Stock)
    ours_model = Net(GraphConv)
    ours_model.load_state_dict(stock_model.state_dict())
    torch._dynamo.reset()
    stock_expl, stock_exc = _outcome(lambda: torch._dynamo.explain(stock_model)(g, x))
    torch._dynamo.reset()
    ours_expl, ours_exc = _outcome(lambda: torch._dynamo.explain(ours_model)(g, x))
    assert depth() == 0
    if stock_exc is not None:  # torch 2.2's Dynamo fails inside DGL 2.1 itself: alike
        assert type(ours_exc) is type(stock_exc)
        return
    assert ours_exc is None, ours_exc
    assert ours_expl.graph_break_count == stock_expl.graph_break_count
    assert ours_expl.graph_count == stock_expl.graph_count
    torch._dynamo.reset()
    compiled = torch.compile(ours_model, backend="aot_eager")
    torch.testing.assert_close(compiled(g, x), stock_model(g, x))
    assert depth() == 0
