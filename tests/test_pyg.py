"""instrumented_convs.pyg.GCNConv against the real torch_geometric.nn.GCNConv."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torch_geometric")
import torch_geometric  # noqa: E402
from packaging.version import Version  # noqa: E402
from torch_geometric.nn import GCNConv as Stock  # noqa: E402
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor  # noqa: E402

import instrumented_convs as ic  # noqa: E402
import instrumented_convs.pyg as ipyg  # noqa: E402
from instrumented_convs import configure, region, registry  # noqa: E402
from instrumented_convs.commands.check import PASS, SKIPPED  # noqa: E402
from instrumented_convs.commands.check._cases import cases as check_cases  # noqa: E402
from instrumented_convs.commands.check.equivalence import run_case  # noqa: E402
from instrumented_convs.pyg import GCNConv  # noqa: E402
from instrumented_convs.testing import depth  # noqa: E402

from .helpers import gpu, train_losses  # noqa: E402
from .helpers import outcome as _outcome  # noqa: E402

#: Whether the installed PyG's GCNConv.forward matches our copy (else the layer runs
#: upstream's code inside its one GCNConv step: PyG 2.3 and 2.4, see tests/test_guard.py).
DETAILED = ipyg.DETAILED["GCNConv.forward"]
PYG_VERSION = Version(torch_geometric.__version__)

N, FIN, FOUT = 12, 6, 5
#: A ``torch_sparse.SparseTensor`` adjacency: its tests carry the ``sparse`` mark (conftest.py).
SPARSE_TENSOR = pytest.param("sparse_tensor", marks=pytest.mark.sparse)
KINDS = ["edge_index", SPARSE_TENSOR, "torch_coo", "torch_csr"]


def _graph(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N - 1, (2, 40), generator=g)  # node N-1 stays isolated
    ei[:, 0] = torch.tensor([3, 3])  # one existing self-loop
    ew = (torch.rand(40, generator=g) + 0.1).to(dtype)
    x = torch.randn(N, FIN, generator=g).to(dtype)
    return x, ei, ew


def _adjacency(kind, ei, ew, weighted):
    """(adjacency argument, edge_weight argument) for the input kind."""
    if kind == "edge_index":
        return ei, (ew if weighted else None)
    if kind == "sparse_tensor":
        if not WITH_TORCH_SPARSE:
            pytest.fail("a test that builds a SparseTensor must carry the sparse mark")
        return SparseTensor(
            row=ei[1], col=ei[0], value=ew if weighted else None, sparse_sizes=(N, N)
        ), None
    # torch.sparse: coalesce() has no derivative, so its values carry no gradient
    values = ew.detach() if weighted else torch.ones_like(ew).detach()
    coo = torch.sparse_coo_tensor(ei.flip(0), values, (N, N)).coalesce()
    return (coo if kind == "torch_coo" else coo.to_sparse_csr()), None


def _pair(seed=0, **opts):
    torch.manual_seed(seed)
    stock = Stock(FIN, FOUT, **opts)
    ours = GCNConv(FIN, FOUT, **opts)
    ours.load_state_dict(stock.state_dict())
    return stock, ours


def _assert_same_failure(stock_exc, ours_exc):
    assert ours_exc is not None, f"stock raised {stock_exc!r}, ours did not"
    assert type(ours_exc) is type(stock_exc)
    assert str(ours_exc) == str(stock_exc)


def _run(layer, x, adj, w, calls):
    outs = [layer(x, adj, w) for _ in range(calls)]
    return outs


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("loops_norm", [(None, True), (False, True), (None, False)])
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("improved", [False, True])
def test_outputs_and_gradients_match_stock(
    kind, flow, weighted, bias, loops_norm, cached, improved
):
    MATRIX[(kind, flow, weighted, bias, loops_norm, cached, improved)] = _compare_with_stock(
        kind, flow, weighted, bias, loops_norm, cached, improved
    )


#: What each combination of the matrix compared: "outputs" or "failure" (stock raised).
MATRIX: dict = {}


def _compare_with_stock(kind, flow, weighted, bias, loops_norm, cached, improved):
    add_self_loops, normalize = loops_norm
    opts = dict(
        improved=improved,
        cached=cached,
        add_self_loops=add_self_loops,
        normalize=normalize,
        bias=bias,
        flow=flow,
    )
    stock, ours = _pair(**opts)
    x0, ei, ew0 = _graph()
    results = []
    for layer in (stock, ours):
        x = x0.clone().requires_grad_()
        ew = ew0.clone().requires_grad_()
        adj, w = _adjacency(kind, ei, ew, weighted)

        def forward_backward():
            outs = _run(layer, x, adj, w, 2 if cached else 1)
            sum(o.pow(2).sum() for o in outs).backward()
            return outs

        outs, exc = _outcome(forward_backward)
        grads = [x.grad, ew.grad] + [p.grad for p in layer.parameters()]
        results.append((outs, exc, grads))
    (s_out, s_exc, s_grads), (o_out, o_exc, o_grads) = results
    if s_exc is not None:
        _assert_same_failure(s_exc, o_exc)
        assert depth() == 0
        return "failure"
    assert o_exc is None, o_exc
    for a, b in zip(s_out, o_out):
        torch.testing.assert_close(b, a)
    for a, b in zip(s_grads, o_grads):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a)
    return "outputs"


@pytest.mark.parametrize("kind", KINDS)
def test_the_matrix_compared_outputs_where_stock_computes_them(request, kind):
    """Runs after the matrix (file order): what the 96 combinations of the input kind compared.

    The stock layer refuses sparse input (SparseTensor, torch.sparse) with
    ``flow="target_to_source"`` (MessagePassing asks for the transposed matrix instead), on
    every PyG release we test: 48 combinations per sparse kind, where only the failure is
    compared. PyG 2.3's backward through a weighted SparseTensor fails too (its spmm returns
    a gradient of the wrong layout for the edge weights: "SparseCompressedTensorBackward0
    returned an invalid gradient"): 24 more. Everywhere else outputs and gradients were compared.
    """
    selected = [
        item
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_outputs_and_gradients_match_stock"
        and item.callspec.params["kind"] == kind
    ]
    if len(selected) < 96:  # (-k or -m chose part of it: what ran is not the whole matrix)
        pytest.skip(f"{96 - len(selected)} of the matrix's 96 {kind} combinations deselected")
    ran = {k: v for k, v in MATRIX.items() if k[0] == kind}
    assert len(ran) == 96, "the matrix did not run whole (is the file run in order?)"
    refused = {k for k in ran if k[0] != "edge_index" and k[1] == "target_to_source"}
    if kind == "sparse_tensor" and PYG_VERSION < Version("2.4"):
        refused |= {k for k in ran if k[2]}  # weighted
    assert {k for k, v in ran.items() if v == "failure"} == refused
    assert list(ran.values()).count("outputs") == len(ran) - len(refused)
    expected = 0 if kind == "edge_index" else 48
    if kind == "sparse_tensor" and PYG_VERSION < Version("2.4"):
        expected += 24
    assert len(refused) == expected


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((FIN, FOUT), dict(add_self_loops=True, normalize=False)),  # refused by PyG >= 2.5
        ((FIN, FOUT), dict(normalize=False)),  # add_self_loops' default: None (2.5+) or True
        ((FIN, FOUT, True, True, False), {}),  # positional arguments
        ((FIN,), {}),  # missing out_channels
    ],
)
def test_constructor_behaves_like_stock(args, kwargs):
    stock, s_exc = _outcome(lambda: Stock(*args, **kwargs))
    ours, o_exc = _outcome(lambda: GCNConv(*args, **kwargs))
    if s_exc is not None:
        _assert_same_failure(s_exc, o_exc)
        return
    assert o_exc is None, o_exc
    for name in ("improved", "cached", "add_self_loops", "normalize", "flow", "aggr", "node_dim"):
        assert getattr(ours, name) == getattr(stock, name), name
    assert repr(ours) == repr(stock)


def test_signature_is_the_stock_constructors():
    import inspect

    assert inspect.signature(GCNConv) == inspect.signature(Stock)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_dtypes_behave_like_stock(kind, dtype):
    stock, ours = _pair()
    stock, ours = stock.to(dtype), ours.to(dtype)
    x, ei, ew = _graph(dtype)
    adj, w = _adjacency(kind, ei, ew, True)
    s, s_exc = _outcome(lambda: stock(x, adj, w))
    o, o_exc = _outcome(lambda: ours(x, adj, w))
    if s_exc is not None:
        _assert_same_failure(s_exc, o_exc)
    else:
        assert o_exc is None, o_exc
        assert o.dtype == s.dtype == dtype
        torch.testing.assert_close(o, s)


def test_is_a_stock_layer_with_the_same_parameters_repr_and_state_dict():
    torch.manual_seed(3)
    stock = Stock(FIN, FOUT, improved=True, cached=True)
    torch.manual_seed(3)
    ours = GCNConv(FIN, FOUT, improved=True, cached=True)
    assert isinstance(ours, Stock)
    assert repr(ours) == repr(stock)
    assert list(ours.state_dict()) == list(stock.state_dict())
    for (na, a), (nb, b) in zip(stock.named_parameters(), ours.named_parameters()):
        assert na == nb and torch.equal(a, b)
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in stock.named_buffers()]
    # weights move both ways
    torch.manual_seed(4)
    other = Stock(FIN, FOUT, improved=True, cached=True)
    ours.load_state_dict(other.state_dict(), strict=True)
    assert torch.equal(ours.lin.weight, other.lin.weight)
    stock.load_state_dict(ours.state_dict(), strict=True)
    assert torch.equal(stock.bias, other.bias)
    # reset_parameters consumes the RNG alike and clears the cache
    torch.manual_seed(5)
    stock.reset_parameters()
    torch.manual_seed(5)
    ours._cached_edge_index = (torch.zeros(1), None)
    ours.reset_parameters()
    assert torch.equal(ours.lin.weight, stock.lin.weight)
    assert ours._cached_edge_index is None


def test_pyg_generated_propagate_is_kept():
    # PyG >= 2.5 compiles a class-specific propagate from a template; losing it would cost
    # speed. Older releases have no template: then neither layer has one.
    layer, stock = GCNConv(FIN, FOUT), Stock(FIN, FOUT)
    generated = stock.propagate.__module__.endswith("GCNConv_propagate")
    assert layer.propagate.__module__.endswith("GCNConv_propagate") == generated
    if generated:
        assert layer.propagate.__module__.startswith("instrumented_convs.pyg")


class Net(torch.nn.Module):
    """The study's 3-layer GCN."""

    def __init__(self, conv_cls, cached=False):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [
                conv_cls(FIN, 16, cached=cached),
                conv_cls(16, 16, cached=cached),
                conv_cls(16, 3, cached=cached),
            ]
        )

    def forward(self, x, adj):
        for conv in self.convs[:-1]:
            x = F.relu(conv(x, adj))
        return F.log_softmax(self.convs[-1](x, adj), dim=-1)


@pytest.mark.parametrize("kind", KINDS)
def test_three_layer_model_trains_to_identical_losses(kind):
    x, ei, ew = _graph()
    adj, _ = _adjacency(kind, ei, ew, False)
    y = torch.arange(N) % 3
    losses = []
    for conv_cls in (Stock, GCNConv):
        torch.manual_seed(0)
        losses.append(train_losses(Net(conv_cls), (x, adj), y))
    assert losses[0] == losses[1]


EDGE_INDEX_STEPS = [
    "GCNConv",
    "GCNConv/gcn_norm",
    "GCNConv/gcn_norm/add_remaining_self_loops",
    "GCNConv/gcn_norm/degree",
    "GCNConv/gcn_norm/normalize",
    "GCNConv/lin",
    "GCNConv/propagate",
    "GCNConv/propagate/collect",
    "GCNConv/propagate/message",
    "GCNConv/propagate/aggregate",
    "GCNConv/bias",
]
SPARSE_TENSOR_STEPS = [
    "GCNConv",
    "GCNConv/gcn_norm",
    "GCNConv/gcn_norm/fill_value",
    "GCNConv/gcn_norm/fill_diag",
    "GCNConv/gcn_norm/degree",
    "GCNConv/gcn_norm/normalize",
    "GCNConv/lin",
    "GCNConv/propagate",
    "GCNConv/propagate/message_and_aggregate",
    "GCNConv/bias",
]
TORCH_SPARSE_STEPS = [
    "GCNConv",
    "GCNConv/gcn_norm",
    "GCNConv/gcn_norm/add_self_loops",
    "GCNConv/gcn_norm/to_edge_index",
    "GCNConv/gcn_norm/degree",
    "GCNConv/gcn_norm/normalize",
    "GCNConv/lin",
    "GCNConv/propagate",
    "GCNConv/propagate/message_and_aggregate",
    "GCNConv/bias",
]


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("edge_index", EDGE_INDEX_STEPS),
        pytest.param("sparse_tensor", SPARSE_TENSOR_STEPS, marks=pytest.mark.sparse),
        ("torch_coo", TORCH_SPARSE_STEPS),
        ("torch_csr", TORCH_SPARSE_STEPS),
    ],
)
def test_steps_of_a_three_layer_model(kind, expected):
    if not DETAILED:  # upstream's forward, its parts timed from outside (PyG 2.3, 2.4)
        expected = [n for n in expected if n != "GCNConv/bias"]  # in the layer's own time
        at = expected.index("GCNConv/propagate") + 1
        if expected[at] != "GCNConv/propagate/collect":  # 2.3/2.4's propagate gathers when fused
            expected.insert(at, "GCNConv/propagate/collect")
        expected.append("GCNConv/propagate/update")  # PyG's update, timed as generic layers do
    x, ei, ew = _graph()
    adj, _ = _adjacency(kind, ei, ew, False)
    model = Net(GCNConv)
    k = 4
    for _ in range(k):
        model(x, adj)
    s = registry.summary()
    assert [r.name for r in s] == expected
    assert all(r.count == 3 * k for r in s), [(r.name, r.count) for r in s]
    assert s["GCNConv"].kind == ("step" if DETAILED else "upstream")
    assert ("(upstream code)" in str(s)) != DETAILED  # the table says which code ran
    # the layer's time is split into its steps: self times are small but not negative
    assert all(r.self_time >= 0 for r in s)
    assert sum(r.fraction for r in s.children(None)) == pytest.approx(1.0)
    by_layer = registry.summary(by="layer")
    scopes = {r.scope for r in by_layer}
    assert len(scopes) == 3 and all(sc.startswith("GCNConv#") for sc in scopes)


def test_the_fallback_keeps_the_breakdown_and_the_numbers(monkeypatch):
    """Upstream's own forward (the copy differs from the installed release) timed from
    outside: the same outputs and gradients as stock, the steps but the bias, and upstream's
    module global put back."""
    import torch_geometric.nn.conv.gcn_conv as gc

    import instrumented_convs.pyg.gcn as ipyg

    monkeypatch.setattr(ipyg, "_FORWARD_OK", False)
    monkeypatch.setattr(GCNConv, "_ic_kind", "upstream")
    original = gc.gcn_norm
    stock, ours = _pair()
    x, ei, ew = _graph()
    xs, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_s, out_o = stock(xs, ei, ew), ours(xo, ei, ew)
    torch.testing.assert_close(out_o, out_s, rtol=0, atol=0)
    out_s.square().sum().backward()
    out_o.square().sum().backward()
    torch.testing.assert_close(xo.grad, xs.grad, rtol=0, atol=0)
    assert gc.gcn_norm is original and depth() == 0
    s = registry.summary()
    names = [r.name for r in s if r.phase == "forward"]
    assert names[:6] == ["GCNConv", "GCNConv/gcn_norm", *EDGE_INDEX_STEPS[2:5], "GCNConv/lin"]
    assert "GCNConv/propagate/aggregate" in names and "GCNConv/bias" not in names
    assert s["GCNConv"].kind == "upstream" and "(upstream code)" in str(s)


@pytest.mark.parametrize("kind", KINDS)
def test_cache_hits_record_no_gcn_norm(kind):
    x, ei, ew = _graph()
    adj, _ = _adjacency(kind, ei, ew, False)
    model = Net(GCNConv, cached=True)
    with region("forward"):
        model(x, adj)
    for _ in range(3):
        with region("forward"):
            model(x, adj)
    s = registry.summary()
    assert s["forward/GCNConv"].count == 12
    # the copy or upstream's own forward timed from outside alike (PyG 2.3, 2.4)
    assert s["forward/GCNConv/gcn_norm"].count == 3  # first call of each layer only
    assert s["forward/GCNConv/lin"].count == 12


def test_name_layers_uses_module_paths():
    x, ei, _ = _graph()
    model = Net(GCNConv)
    ic.name_layers(model)
    model(x, ei)
    scopes = [r.scope for r in registry.summary(by="layer") if r.step == "GCNConv"]
    assert scopes == ["convs.0", "convs.1", "convs.2"]


def test_disabled_runs_the_stock_code(monkeypatch):
    import instrumented_convs.pyg.gcn as ipyg

    def fail(*a, **k):
        raise AssertionError("instrumented code used while disabled")

    monkeypatch.setattr(ipyg, "_instrumented_gcn_norm", fail)
    monkeypatch.setattr(GCNConv, "_instrumented_forward", fail)
    monkeypatch.setattr(ipyg, "_FORWARD_OK", True)
    stock, ours = _pair()
    x, ei, ew = _graph()
    with configure(enabled=False):
        torch.testing.assert_close(ours(x, ei, ew), stock(x, ei, ew))
        torch.testing.assert_close(ipyg.gcn_norm(ei, ew, N), ipyg._stock_gcn_norm(ei, ew, N))
    assert len(registry.summary()) == 0
    with pytest.raises(AssertionError, match="while disabled"):
        ours(x, ei, ew)
    assert depth() == 0


@pytest.mark.parametrize(
    "case", ["tuple_features", "wrong_feature_size", "index_out_of_range", "bad_edge_index_shape"]
)
@pytest.mark.parametrize("kind", ["edge_index", SPARSE_TENSOR])
def test_bad_input_raises_like_stock_and_leaves_the_stack_balanced(case, kind):
    stock, ours = _pair()
    x, ei, ew = _graph()
    if case == "tuple_features":
        x = (x, x)
    elif case == "wrong_feature_size":
        x = torch.randn(N, FIN + 1)
    elif case == "index_out_of_range":
        ei = ei.clone()
        ei[0, 5] = N + 7
        if kind == "sparse_tensor":
            pytest.skip("a SparseTensor cannot hold an out-of-range index")
    elif case == "bad_edge_index_shape":
        ei = ei[0]
        if kind == "sparse_tensor":
            pytest.skip("not an edge_index")
    adj, w = (ei, ew) if kind == "edge_index" else _adjacency(kind, ei, ew, True)
    _, s_exc = _outcome(lambda: stock(x, adj, w))
    _, o_exc = _outcome(lambda: ours(x, adj, w))
    assert s_exc is not None
    _assert_same_failure(s_exc, o_exc)  # the stock layer's exception: its type and message
    assert depth() == 0
    # the next forward is recorded normally
    registry.reset()
    x2, ei2, ew2 = _graph()
    ours(x2, ei2, ew2)
    s = registry.summary()
    assert s["GCNConv"].count == 1 and s["GCNConv"].errors == 0
    assert "GCNConv/lin" in s


def test_torch_compile_matches_and_breaks_no_more_graphs_than_stock():
    x, ei, _ = _graph()
    torch.manual_seed(0)
    stock_model = Net(Stock)
    torch.manual_seed(0)
    ours_model = Net(GCNConv)
    ours_model.load_state_dict(stock_model.state_dict())
    torch._dynamo.reset()
    stock_expl = torch._dynamo.explain(stock_model)(x, ei)
    torch._dynamo.reset()
    ours_expl = torch._dynamo.explain(ours_model)(x, ei)
    assert ours_expl.graph_break_count == stock_expl.graph_break_count
    assert ours_expl.graph_count == stock_expl.graph_count
    torch._dynamo.reset()
    _, stock_exc = _outcome(lambda: torch.compile(stock_model, backend="aot_eager")(x, ei))
    torch._dynamo.reset()
    got, exc = _outcome(lambda: torch.compile(ours_model, backend="aot_eager")(x, ei))
    assert depth() == 0
    if stock_exc is not None:  # PyG 2.5 with torch 2.13: AOT autograd fails on the stock layer
        assert type(exc) is type(stock_exc)
        return
    assert exc is None, exc
    torch.testing.assert_close(got, stock_model(x, ei))


class ScriptableNet(torch.nn.Module):
    """Two layers as attributes (TorchScript cannot script the ModuleList slice of Net)."""

    def __init__(self, conv_cls):
        super().__init__()
        self.conv1 = conv_cls(FIN, 16)
        self.conv2 = conv_cls(16, 3)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


def test_torch_jit_script_compiles_the_stock_layer_sharing_parameters(caplog):
    x, ei, _ = _graph()
    torch.manual_seed(0)
    model = ScriptableNet(GCNConv)
    _, stock_exc = _outcome(lambda: torch.jit.script(ScriptableNet(Stock)))
    with caplog.at_level(logging.WARNING, logger="instrumented_convs"):
        scripted, exc = _outcome(lambda: torch.jit.script(model))
    assert any("torch.jit.script" in r.message for r in caplog.records)
    if stock_exc is not None:  # PyG < 2.5 needs layer.jittable() first: stock fails alike
        assert type(exc) is type(stock_exc)
        return
    assert exc is None, exc
    torch.testing.assert_close(scripted(x, ei), model(x, ei))
    with torch.no_grad():
        model.conv1.lin.weight.mul_(2)
    torch.testing.assert_close(scripted(x, ei), model(x, ei))
    registry.reset()
    scripted(x, ei)
    assert len(registry.summary()) == 0  # the scripted model runs stock code


def test_torch_jit_script_keeps_the_layers_alive_and_instrument_puts_them_back(caplog):
    """torch.jit.script writes our stock copies into the model and tells modules apart by
    ``id`` while it prepares them: a layer freed then lends its ``id`` to a new copy, which
    torch mistakes for it (seen once in CI: ``self.lin`` compiled as a GCNConv). The copies
    keep the layers alive, and ``instrument(model)`` puts them back, the same objects."""
    import weakref

    x, ei, _ = _graph()
    torch.manual_seed(0)
    ScriptableNet(Stock)  # the stock class gets PyG's generated propagate (PyG 2.5+)
    model = ScriptableNet(GCNConv)
    originals = [model.conv1, model.conv2]
    alive = [weakref.ref(m) for m in originals]
    del originals
    with caplog.at_level(logging.WARNING, logger="instrumented_convs"):
        scripted, exc = _outcome(lambda: torch.jit.script(model))
    assert all(r() is not None for r in alive)  # not freed while torch still compares ids
    assert type(model.conv1) is Stock  # torch left our stock copy in the model
    assert "instrument(model) puts the instrumented layer back" in caplog.text
    ic.instrument(model)
    assert [model.conv1, model.conv2] == [r() for r in alive]
    assert (model.conv1.scope, model.conv2.scope) == ("conv1", "conv2")
    registry.reset()
    out = model(x, ei)
    assert registry.summary()["GCNConv"].count == 2  # recording again
    if exc is None:
        torch.testing.assert_close(scripted(x, ei), out)


def test_to_stock_and_from_stock_share_parameters():
    stock, _ = _pair(improved=True)
    ours = GCNConv.from_stock(stock)
    assert ours.lin.weight is stock.lin.weight and ours.bias is stock.bias and ours.improved
    back = ours.to_stock()
    assert type(back) is Stock and back.lin.weight is stock.lin.weight
    x, ei, ew = _graph()
    torch.testing.assert_close(ours(x, ei, ew), stock(x, ei, ew))
    torch.testing.assert_close(back(x, ei, ew), stock(x, ei, ew))


@gpu
@pytest.mark.parametrize(
    "case", [c for c in check_cases() if c.framework == "pyg"], ids=lambda c: c.name
)
def test_cuda_equivalence_and_event_timing(case):
    """The check's own comparison (python -m instrumented_convs check --device cuda): stock's
    outputs, gradients and state_dict on the GPU, our rows timed with CUDA events."""
    status, detail, _ = run_case(case, torch.device("cuda", 0), 300)
    assert status in (PASS, SKIPPED), detail  # SKIPPED: torch-sparse not installed


@pytest.mark.parametrize("kind", ["edge_index", SPARSE_TENSOR])
def test_autocast_matches_stock(kind):
    stock, ours = _pair()
    x, ei, ew = _graph()
    adj, w = _adjacency(kind, ei, ew, True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s, s_exc = _outcome(lambda: stock(x, adj, w))
        o, o_exc = _outcome(lambda: ours(x, adj, w))
    if s_exc is not None:  # PyG 2.3's spmm refuses bfloat16 features with a float SparseTensor
        _assert_same_failure(s_exc, o_exc)
        return
    assert o_exc is None, o_exc
    assert o.dtype == s.dtype
    torch.testing.assert_close(o, s)
