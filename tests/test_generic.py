"""Generic layers and instrument(model) in real models: TorchScript, torch.compile, bad input,
PyG's Sequential and to_hetero, DGL's HeteroGraphConv, models mixing ours and stock layers."""

from __future__ import annotations

import copy
import logging
import re
import subprocess
import sys

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs import registry
from instrumented_convs.testing import depth

from .helpers import child_env, outcome, random_graph

pyg = pytest.importorskip("torch_geometric")
import torch_geometric.nn as gnn  # noqa: E402

from instrumented_convs import pyg as P  # noqa: E402


def _graph(n=10, e=30, f=8, seed=0):
    return random_graph(n, e, f, seed=seed)


def _pair(name, *args, **kwargs):
    """A stock layer and ours with equal parameters (module arguments built afresh for each)."""

    def build(cls):
        torch.manual_seed(0)
        return cls(
            *(a() if callable(a) and not isinstance(a, torch.nn.Module) else a for a in args),
            **kwargs,
        )

    stock, ours = build(getattr(gnn, name)), build(getattr(P, name))
    ours.load_state_dict(stock.state_dict())
    return stock, ours


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())


LAYERS = [("SAGEConv", (8, 16), {}), ("GATConv", (8, 4), {"heads": 2}), ("GINConv", (_mlp,), {})]


@pytest.mark.parametrize("name,args,kwargs", LAYERS, ids=[n for n, _, _ in LAYERS])
def test_torch_jit_script_compiles_a_stock_copy_sharing_parameters(name, args, kwargs, caplog):
    x, ei = _graph()
    stock, ours = _pair(name, *args, **kwargs)
    _, stock_exc = outcome(lambda: torch.jit.script(copy.deepcopy(stock))(x, ei))
    with caplog.at_level(logging.WARNING, logger="instrumented_convs"):
        scripted, exc = outcome(lambda: torch.jit.script(ours))
        if exc is None:
            _, exc = outcome(lambda: scripted(x, ei))
    assert any("torch.jit.script" in r.message for r in caplog.records)
    if stock_exc is not None:  # PyG < 2.5 needs .jittable(); 2.5's GATConv script has no forward
        assert type(exc) is type(stock_exc)
        return
    assert exc is None, exc
    assert torch.equal(scripted(x, ei), ours(x, ei))
    with torch.no_grad():
        next(ours.parameters()).mul_(2)
    assert torch.equal(scripted(x, ei), ours(x, ei))  # shared parameters
    registry.reset()
    scripted(x, ei)
    assert len(registry.summary()) == 0
    ours(x, ei)
    assert registry.summary()[name].count == 1  # our layer still has its hooks


@pytest.mark.parametrize("name,args,kwargs", LAYERS, ids=[n for n, _, _ in LAYERS])
def test_torch_compile_breaks_no_more_graphs_than_stock(name, args, kwargs):
    x, ei = _graph()
    stock, ours = _pair(name, *args, **kwargs)
    torch._dynamo.reset()
    stock_expl = torch._dynamo.explain(stock)(x, ei)
    torch._dynamo.reset()
    ours_expl = torch._dynamo.explain(ours)(x, ei)
    assert ours_expl.graph_break_count == stock_expl.graph_break_count
    assert ours_expl.graph_count == stock_expl.graph_count
    torch._dynamo.reset()
    _, stock_exc = outcome(lambda: torch.compile(stock, backend="aot_eager")(x, ei))
    torch._dynamo.reset()
    got, exc = outcome(lambda: torch.compile(ours, backend="aot_eager")(x, ei))
    assert depth() == 0
    if stock_exc is not None:
        assert type(exc) is type(stock_exc)
        return
    assert exc is None, exc
    torch.testing.assert_close(got, stock(x, ei))


def test_bad_input_raises_like_stock_and_leaves_the_stack_balanced():
    x, ei = _graph()
    stock, ours = _pair("SAGEConv", 8, 16)
    for bad in ((x, ei.float()), (x[:, :3], ei), (x, ei[:1])):
        _, want = outcome(lambda: stock(*bad))
        _, got = outcome(lambda: ours(*bad))
        assert type(got) is type(want) and str(got) == str(want)
        assert depth() == 0
    s = registry.summary()
    assert s["SAGEConv"].errors == 3
    assert s["SAGEConv/lin_l"].errors == 1  # the child raised (3 features for 8): its step too


def test_disabled_records_nothing_and_runs_the_stock_code():
    x, ei = _graph()
    stock, ours = _pair("GATConv", 8, 4, heads=2)
    with ic.configure(enabled=False):
        assert torch.equal(ours(x, ei), stock(x, ei))
    assert len(registry.summary()) == 0


def test_a_child_assigned_after_construction_is_timed_and_the_old_one_no_longer():
    x, ei = _graph()
    ours = P.SAGEConv(8, 16)
    ours(x, ei)
    old = ours.lin_l
    torch.manual_seed(1)
    ours.lin_l = torch.nn.Linear(8, 16)
    registry.reset()
    out = ours(x, ei)
    s = registry.summary()
    assert s["SAGEConv/lin_l"].count == 1 and s["SAGEConv/lin_r"].count == 1
    assert (
        "forward" not in ours.lin_l.__dict__ and "forward" not in old.__dict__
    )  # only during a forward
    old(x)  # the replaced child, called on its own: stock, not recorded
    assert registry.summary()["SAGEConv/lin_l"].count == 1
    stock = gnn.SAGEConv(8, 16)
    stock.load_state_dict(ours.state_dict())
    assert torch.equal(out, stock(x, ei))


def test_pyg_sequential_and_modulelists_mixing_ours_and_stock_layers():
    x, ei = _graph()
    torch.manual_seed(0)
    model = gnn.Sequential(
        "x, edge_index",
        [
            (P.SAGEConv(8, 16), "x, edge_index -> x"),
            torch.nn.ReLU(),
            (gnn.GINConv(torch.nn.Linear(16, 16)), "x, edge_index -> x"),
            (gnn.GCNConv(16, 4), "x, edge_index -> x"),
        ],
    )
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ic.instrument(model)
    assert type(model.module_2) is P.GINConv and type(model.module_3) is P.GCNConv
    want = ref(x, ei)  # ref's first layer is ours too (a deep copy): its rows go first
    registry.reset()
    assert torch.equal(model(x, ei), want)
    model(x, ei).sum().backward()
    opt.step()  # the optimizer built before instrument() updates the same parameters
    assert not torch.equal(model(x, ei), ref(x, ei))
    s = registry.summary(by="layer")
    assert {"module_0", "module_2", "module_3"} <= {r.scope for r in s.rows if r.depth == 0}
    if P.DETAILED["GCNConv.forward"]:  # the detailed version (PyG 2.5 and later)
        assert "GCNConv/gcn_norm" in registry.summary()
    ic.uninstrument(model)
    assert type(model.module_0) is gnn.SAGEConv and type(model.module_3) is gnn.GCNConv
    registry.reset()
    model(x, ei)
    assert len(registry.summary()) == 0


def test_to_hetero_models_time_every_edge_type():
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import to_hetero

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = gnn.SAGEConv((-1, -1), 16)
            self.conv2 = gnn.GATConv((-1, -1), 4, add_self_loops=False)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["a"].x, data["b"].x = torch.randn(5, 8, generator=g), torch.randn(6, 8, generator=g)
    ei = torch.stack(
        [torch.randint(0, 5, (12,), generator=g), torch.randint(0, 6, (12,), generator=g)]
    )
    data["a", "to", "b"].edge_index, data["b", "rev", "a"].edge_index = ei, ei.flip(0)
    torch.manual_seed(0)
    model, exc = outcome(lambda: to_hetero(Net(), data.metadata()))
    if exc is not None:  # PyG 2.3 to 2.5 cannot trace with torch 2.13: stock fails alike
        assert "Union" in str(exc)
        pytest.skip(f"to_hetero fails with this PyG and torch: {exc}")
    ref = copy.deepcopy(model)
    model(data.x_dict, data.edge_index_dict)  # lazy shapes
    ref.load_state_dict(model.state_dict())
    ic.instrument(model)
    out, want = model(data.x_dict, data.edge_index_dict), ref(data.x_dict, data.edge_index_dict)
    assert all(torch.equal(out[k], want[k]) for k in want)
    rows = registry.summary(by="layer").rows  # (the tool's own row aside: a first call's)
    scopes = {r.scope for r in rows if r.depth == 0 and r.kind != "tool"}
    assert scopes == {"conv1.a__to__b", "conv1.b__rev__a", "conv2.a__to__b", "conv2.b__rev__a"}


def test_hetero_conv_times_each_relation_as_a_child():
    g = torch.Generator().manual_seed(0)
    x = {"a": torch.randn(5, 8, generator=g), "b": torch.randn(6, 8, generator=g)}
    ei = torch.stack(
        [torch.randint(0, 5, (12,), generator=g), torch.randint(0, 6, (12,), generator=g)]
    )
    edges = {("a", "to", "b"): ei, ("b", "rev", "a"): ei.flip(0)}
    torch.manual_seed(0)
    stock = gnn.HeteroConv(
        {
            ("a", "to", "b"): gnn.SAGEConv(8, 4),
            ("b", "rev", "a"): gnn.GATConv(8, 4, add_self_loops=False),
        }
    )
    ours = ic.instrument(copy.deepcopy(stock))
    out, want = ours(x, edges), stock(x, edges)
    assert all(torch.equal(out[k], want[k]) for k in want)
    names = [r.name for r in registry.summary().rows if r.phase == "forward"]
    # each relation's conv is a child step named after its key in HeteroConv's ModuleDict
    assert sum(1 for n in names if re.fullmatch(r"HeteroConv/convs\.[^/]+/SAGEConv", n)) == 1
    assert (
        sum(
            1
            for n in names
            if re.fullmatch(r"HeteroConv/convs\.[^/]+/GATConv/propagate/message", n)
        )
        == 1
    )


def test_torch_jit_script_in_a_fresh_process_where_no_stock_layer_was_built():
    from torch_geometric.nn import MessagePassing

    if not hasattr(MessagePassing, "_set_jittable_templates"):
        pytest.skip("PyG < 2.5 scripts only layers made .jittable(), stock or ours")
    # PyG generates a class's scriptable propagate in its constructor; the stock copy that
    # TorchScript compiles never ran it, so to_stock() has PyG generate it.
    code = (
        "import torch, warnings; warnings.simplefilter('ignore')\n"
        "from instrumented_convs.pyg import SAGEConv\n"
        "c = SAGEConv(8, 32); x = torch.randn(4, 8); ei = torch.tensor([[0, 1], [1, 2]])\n"
        "s = torch.jit.script(c); assert torch.equal(s(x, ei), c(x, ei)); print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv", "GATConv"])
def test_decomposed_layers_switch_to_pygs_python_propagate_as_stock_does(name):
    # PyG runs the written propagate for decomposed_layers > 1; a class generated after the
    # stock one once took the stock's generated propagate for it (found by PyG's own
    # test_gcn_conv.py): the messages were not split.
    from torch_geometric.nn import MessagePassing

    if not hasattr(MessagePassing, "_set_jittable_templates"):
        pytest.skip("PyG < 2.5 has only the written propagate")
    x, ei = _graph()
    runs = []
    for cls in (getattr(gnn, name), getattr(P, name)):  # the stock class generates first
        torch.manual_seed(0)
        conv = cls(8, 16)
        conv.decomposed_layers = 2
        assert conv.propagate.__module__.endswith("message_passing")
        seen = []
        conv.register_message_forward_pre_hook(
            lambda m, inputs, seen=seen: seen.append(inputs[0]["x_j"].shape)
        )
        out, exc = outcome(lambda: conv(x, ei))  # SAGEConv's tuple input cannot be split: raises
        runs.append((seen, out, repr(exc)))
    (seen, out, exc), (our_seen, our_out, our_exc) = runs
    assert our_seen == seen and our_exc == exc
    assert out is None or (torch.equal(our_out, out) and len(seen) == 2)


def test_users_subclasses_of_our_layers_work_and_record():
    x, ei = _graph()

    class Doubled(P.SAGEConv):
        def forward(self, x, edge_index):
            return 2 * super().forward(x, edge_index)

    class Scaled(P.GCNConv):
        def forward(self, x, edge_index, edge_weight=None):
            return 3 * super().forward(x, edge_index, edge_weight)

    torch.manual_seed(0)
    stock = gnn.SAGEConv(8, 16)
    torch.manual_seed(0)
    ours = Doubled(8, 16)
    assert torch.equal(ours(x, ei), 2 * stock(x, ei))
    torch.manual_seed(0)
    stock_gcn = gnn.GCNConv(8, 16)
    torch.manual_seed(0)
    assert torch.equal(Scaled(8, 16)(x, ei), 3 * stock_gcn(x, ei))
    s = registry.summary()
    assert s["SAGEConv/propagate/collect"].count == 1
    # (GCNConv/propagate/collect where GCNConv's copied forward runs; GCNConv/collect on
    # PyG 2.3, 2.4)
    assert (
        sum(r.count for r in s.rows if r.name.startswith("GCNConv/") and r.step == "collect") == 1
    )


def test_the_layer_device_comes_from_a_tensor_first_and_other_devices_last():
    """A DGL graph's ``device`` costs DGL several Python calls: a tensor argument is looked
    at first, wherever it is, and a graph's device only when there is no tensor."""
    from instrumented_convs.layers.generic import device_of

    class Graph:
        reads = 0

        @property
        def device(self):
            Graph.reads += 1
            return torch.device("meta")

    g, x = Graph(), torch.zeros(1)
    assert device_of((g, x), {}) == x.device and Graph.reads == 0
    assert device_of((g,), {"feat": {"n": x}}) == x.device and Graph.reads == 0
    assert device_of((g, [1, x]), {}) == x.device and Graph.reads == 0
    assert device_of((g,), {}) == torch.device("meta") and Graph.reads == 1
    assert device_of((1, "a", (2,)), {}) is None
