"""Memory per step (issue 43): what each step keeps for backward, counted by hand for the
layers users train most, and its peak against torch.profiler's own memory timeline; the
saved-tensor hooks leave autograd's behaviour (its in-place check, the user's own hooks) as
it was; nothing is kept alive; the table, the page, the trace, ``run``, ``view`` and
``diff``."""

from __future__ import annotations

import gc
import gzip
import json
import re
import threading
import warnings
import weakref

import pytest
import torch

from instrumented_convs import configure, region, registry
from instrumented_convs.core.meters import memory
from instrumented_convs.layers import step

from .helpers import ROOT, run_script

F4, I8 = 4, 8  # bytes of a float32, of an int64
N, E, F, H, C, D = 50, 300, 16, 4, 8, 6  # nodes, edges, features in, heads, out, edge dims


def _graph():
    """A random graph of N nodes and E edges without self loops, features, edge features."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, N, (E,), generator=g)
    dst = (src + torch.randint(1, N, (E,), generator=g)) % N  # never src: no self loops
    return torch.stack([src, dst]), torch.randn(N, F, generator=g), torch.randn(E, D, generator=g)


def _saved(fn):
    """Run ``fn()`` (a forward) and its backward with memory on: forward path -> saved."""
    registry.reset()
    with configure(memory=True):
        fn().sum().backward()
    return {r.name: r.saved_bytes for r in registry.summary() if r.phase == "forward"}


def _kept(saved):
    """The rows of ``saved`` that kept anything (path: bytes)."""
    return {k: v for k, v in saved.items() if v}


def test_off_by_default_nothing_is_recorded_and_the_hooks_come_and_go():
    with step("a"):
        torch.ones(3, requires_grad=True).exp()
    row = registry.summary()["a"]
    assert (row.saved_bytes, row.mem_calls, row.peak_bytes) == (0, 0, 0)
    assert "nothing recorded" in registry.summary().table(memory=True)
    assert "Saved/call" not in registry.summary().table()
    with configure(memory=True) as before:
        assert before.memory is False and configure().memory is True and memory.is_on()
    assert not memory.is_on() and configure().memory is False


def test_gcnconv_keeps_its_edge_index_with_self_loops_and_their_weights():
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import GCNConv

    ei, x, _ = _graph()
    e = E + N  # the self loops added
    saved = _saved(lambda: GCNConv(F, C)(x, ei))
    assert _kept(saved) == {
        "GCNConv": I8 * 2 * e + F4 * e,
        "GCNConv/gcn_norm": I8 * 2 * e + F4 * e,
        # the edge index with its self loops, saved by the gather and the scatter: once
        "GCNConv/gcn_norm/add_remaining_self_loops": I8 * 2 * e,
        # the normalised edge weights, saved by the message's product
        "GCNConv/gcn_norm/normalize": F4 * e,
    }


def test_sageconv_keeps_the_aggregated_features_its_lin_l_reads():
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import SAGEConv

    ei, x, _ = _graph()
    saved = _saved(lambda: SAGEConv(F, C)(x, ei))
    # the input features are the data, the edge index too: only the mean made in aggregate
    assert _kept(saved) == {
        "SAGEConv": F4 * N * F,
        "SAGEConv/propagate": F4 * N * F,
        "SAGEConv/propagate/aggregate": F4 * N * F,
    }


@pytest.mark.parametrize("edge_dim", [None, D], ids=["heads", "heads-edge-features"])
def test_gatconv_keeps_per_edge_and_head_what_its_attention_needs(edge_dim):
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import GATConv

    ei, x, ea = _graph()
    e = E + N
    conv = GATConv(F, C, heads=H, edge_dim=edge_dim)
    saved = _saved(lambda: conv(x, ei, edge_attr=ea if edge_dim else None))
    # the attention's E x H tensors: the leaky ReLU's input, the softmax's exp and its sum
    # gathered back to the edges, the coefficients the message multiplies by
    attention = 4 * F4 * e * H
    want = {
        "GATConv/lin": F4 * N * H * C,  # the projected features, times the attention vectors
        "GATConv/add_self_loops": I8 * 2 * e,
        "GATConv/propagate/collect": F4 * e * H * C,  # x_j, times the coefficients
        "GATConv/propagate": F4 * e * H * C,
        "GATConv/edge_updater/edge_update": attention,
    }
    if edge_dim:
        want["GATConv/add_self_loops"] += F4 * e * D  # the edge features with their loops' mean
        want["GATConv/edge_updater/edge_update/lin_edge"] = F4 * e * H * C  # projected
        want["GATConv/edge_updater/edge_update"] += F4 * e * H * C
    want["GATConv/edge_updater"] = want["GATConv/edge_updater/edge_update"]
    want["GATConv"] = sum(
        want[f"GATConv/{k}"] for k in ("lin", "add_self_loops", "edge_updater", "propagate")
    )
    assert _kept(saved) == want


@pytest.mark.sparse
def test_gcnconv_on_a_sparse_tensor_keeps_the_adjacency_it_builds():
    pytest.importorskip("torch_sparse")
    from torch_sparse import SparseTensor

    from instrumented_convs.pyg import GCNConv

    ei, x, _ = _graph()
    e = E + N
    adj = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(N, N))
    saved = _saved(lambda: GCNConv(F, C)(x, adj.t()))
    assert _kept(saved) == {
        "GCNConv": I8 * e + I8 * (N + 1) + F4 * e + F4 * N * C,
        "GCNConv/gcn_norm": I8 * e + I8 * (N + 1) + F4 * e,
        "GCNConv/gcn_norm/fill_diag": I8 * e,  # the columns with the diagonal filled
        "GCNConv/gcn_norm/degree": I8 * (N + 1),  # the row pointers the degree computed
        "GCNConv/gcn_norm/normalize": F4 * e,  # the normalised values
        "GCNConv/lin": F4 * N * C,  # the features spmm multiplies (it saves them)
    }


def test_dgl_graphconv_and_gatconv_keep_what_their_kernels_need():
    dgl = pytest.importorskip("dgl")
    from instrumented_convs.dgl import GATConv, GraphConv

    ei, x, _ = _graph()
    g = dgl.graph((ei[0], ei[1]), num_nodes=N)
    saved = _saved(lambda: GraphConv(F, C, allow_zero_in_degree=True)(g, x))
    # in > out: the weight first, on the features scaled by the source norm; then the
    # destination norm, saved by its product
    assert _kept(saved) == {
        "GraphConv": F4 * N * F + F4 * N,
        "GraphConv/norm_src": F4 * N * F,
        "GraphConv/norm_src/mul": F4 * N * F,
        "GraphConv/norm_dst": F4 * N,
        "GraphConv/norm_dst/pow": F4 * N,
    }
    saved = _saved(lambda: GATConv(F, C, num_heads=H, allow_zero_in_degree=True)(g, x))
    assert _kept(saved) == {
        "GATConv": F4 * N * H * C + 2 * F4 * E * H,
        "GATConv/fc": F4 * N * H * C,
        # DGL's fused kernels, unseen by the dispatcher, noted where they are called
        "GATConv/apply_edges": F4 * E * H,  # e = el + er, the leaky ReLU's input
        "GATConv/apply_edges/gsddmm": F4 * E * H,
        "GATConv/edge_softmax": F4 * E * H,  # its output, saved by it and by the message
    }


def test_views_and_shared_storages_count_once_in_place_ops_keep_their_maker():
    w = torch.randn(8, requires_grad=True)
    with configure(memory=True):
        with step("make"):
            y = w * 2  # 8 floats, made here
        with step("in place"):
            y.mul_(3)  # the same storage: still make's
        with step("use"):
            a = y[:4].sin()  # saves a view of y
            b = y[4:].cos()  # another view of the same storage
            c = a.exp()  # saves its output: made here
        (b.sum() + c.sum()).backward()
    saved = {r.name: r.saved_bytes for r in registry.summary()}
    assert saved == {"make": F4 * 8, "in place": 0, "use": F4 * 4}


def test_under_no_grad_a_layer_keeps_nothing_and_its_peak_is_still_measured():
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import GCNConv

    ei, x, _ = _graph()
    with configure(memory=True), torch.no_grad():
        GCNConv(F, C)(x, ei)
    rows = registry.summary().rows
    assert all(r.saved_bytes == 0 for r in rows)
    top = registry.summary()["GCNConv"]
    assert top.mem_calls == 1 and top.peak_bytes >= F4 * (E + N) * C  # the messages


def test_outputs_gradients_and_state_are_the_stock_layers():
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GATConv as Stock

    from instrumented_convs.pyg import GATConv

    ei, x, ea = _graph()
    torch.manual_seed(1)
    stock = Stock(F, C, heads=H, edge_dim=D)
    ours = GATConv(F, C, heads=H, edge_dim=D)
    ours.load_state_dict(stock.state_dict())
    xs, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_s = stock(xs, ei, edge_attr=ea)
    with configure(memory=True):
        out_o = ours(xo, ei, edge_attr=ea)
        out_o.pow(2).sum().backward()
    out_s.pow(2).sum().backward()
    assert torch.equal(out_s, out_o) and torch.equal(xs.grad, xo.grad)
    for (k, p), (_, q) in zip(stock.named_parameters(), ours.named_parameters()):
        assert torch.equal(p.grad, q.grad), k
    assert stock.state_dict().keys() == ours.state_dict().keys()


def _inplace_error(kind):
    """Autograd's error for a saved tensor changed in place (an output, or an input)."""
    a = torch.randn(5, 3, requires_grad=True)
    with step("s"):
        b = a.exp() if kind == "output" else a * 1
        c = b if kind == "output" else b.sin()
    with torch.no_grad():
        b.mul_(2)
    with pytest.raises(RuntimeError) as info:
        c.sum().backward()
    return str(info.value)


@pytest.mark.parametrize("anomaly", [False, True])
@pytest.mark.parametrize("kind", ["output", "input"])
def test_a_saved_tensor_changed_in_place_raises_autograds_own_error(kind, anomaly):
    """Hooks turn autograd's version check off: ours makes it, in autograd's words."""
    with torch.autograd.set_detect_anomaly(anomaly), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # anomaly detection's own, about the forward
        stock = _inplace_error(kind)
        with configure(memory=True):
            ours = _inplace_error(kind)
    assert ours == stock


def test_the_users_hooks_set_before_are_called_by_ours():
    calls, unpacked = [], []

    def pack(t):
        calls.append(t.shape)
        return ("mine", t.detach())

    def unpack(packed):
        unpacked.append(packed[0])
        return packed[1]

    w = torch.randn(8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        with configure(memory=True):
            with step("make"):
                y = (w * 2).exp()  # exp saves its output
        y.sum().backward()  # memory off by now: their unpack all the same
    assert calls[-1] == torch.Size([8]) and unpacked == ["mine"]
    assert torch.allclose(w.grad, 2 * y.detach())
    row = registry.summary()["make"]
    if memory._top is not None:  # torch 2.4+: the user's hooks are found and called by ours
        assert calls == [torch.Size([8])] and (row.saved_bytes, row.saved_aside) == (F4 * 8, 0)
    else:  # before: a probe saved one tensor to find them; ours stepped aside
        assert calls == [torch.Size([1]), torch.Size([8])]
        assert (row.saved_bytes, row.saved_aside) == (0, 1)


@pytest.mark.skipif(memory._top is None, reason="torch < 2.4 cannot tell whose hooks are on top")
def test_save_on_cpu_set_after_hides_what_it_saves_and_the_table_says_so():
    w = torch.randn(8, requires_grad=True)
    with configure(memory=True):
        with torch.autograd.graph.save_on_cpu():
            with step("make"):
                y = (w * 2).exp()
            y.sum().backward()
            with pytest.raises(RuntimeError, match="turn it off after the block"):
                configure(memory=False)
    row = registry.summary()["make"]
    assert (row.saved_bytes, row.saved_aside) == (0, 1)
    assert "make (1 calls)" in registry.summary().table(memory=True)
    assert not memory.is_on()


def test_turned_off_on_another_thread_raises():
    configure(memory=True)
    try:
        errors = []

        def off():
            try:
                configure(memory=False)
            except RuntimeError as e:
                errors.append(str(e))

        t = threading.Thread(target=off)
        t.start()
        t.join()
        assert errors and "the thread that turned it on" in errors[0]
        assert memory.is_on()
    finally:
        configure(memory=False)


def test_nothing_is_kept_alive_and_memory_is_flat_over_1000_recorded_steps():
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import GCNConv

    ei, x, _ = _graph()
    conv = GCNConv(F, C)
    opt = torch.optim.SGD(conv.parameters(), lr=0.01)
    seen = []
    with configure(memory=True):
        for i in range(1001):
            opt.zero_grad()  # the gradients go: what is alive now is what the tool holds
            if i in (10, 1000):
                gc.collect()
                seen.append((len(memory._live), memory._alive, len(weakref.finalize._registry)))
                if i == 1000:
                    break
            out = conv(x, ei)
            if i == 0:
                alive = weakref.ref(out)
                storage = out.untyped_storage()
                freed = []
                weakref.finalize(storage, freed.append, 1)
                del storage
            out.sum().backward()
            opt.step()
            del out
    assert alive() is None and freed == [1]
    assert seen[0] == seen[1]  # nothing grows: notes, bytes alive, finalizers
    assert registry.summary()["GCNConv"].count == 1000


def test_each_steps_peak_is_torch_profilers_high_water_mark():
    """profile_memory's timeline (every allocation and free the CPU allocator reported, with
    its time) read over each step's profiler label: its high-water mark above the step's
    start. Ours is the same where a step's ops make no scratch buffers, never above."""
    pytest.importorskip("torch_geometric")
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    from instrumented_convs.pyg import GATConv, GCNConv, SAGEConv

    ei, x, _ = _graph()
    for conv in (GCNConv(F, C), SAGEConv(F, C), GATConv(F, C, heads=H)):
        conv(x, ei)  # warm: nothing allocated once
        registry.reset()
        with configure(memory=True):
            with profile(
                activities=[ProfilerActivity.CPU],
                profile_memory=True,
                record_shapes=True,
                with_stack=True,
            ) as prof:
                conv(x, ei).sum().backward()
        deltas = sorted(
            (t, size if action == Action.CREATE else -size)
            for t, action, _, size in prof._memory_profile().timeline
            if action in (Action.CREATE, Action.DESTROY)
        )
        base = prof.profiler.kineto_results.trace_start_ns()
        rows = {r.name: r for r in registry.summary().rows if r.phase == "forward"}
        labels = [e for e in prof.events() if e.name in {n.split("/")[-1] for n in rows}]
        compared = same = 0
        path = []
        for e in sorted(labels, key=lambda e: e.time_range.start):
            t0, t1 = base + e.time_range.start * 1000, base + e.time_range.end * 1000
            while path and path[-1][1] < t0:  # the labels nest: their paths from the stack
                path.pop()
            path.append((e.name, t1))
            row = rows.get("/".join(p[0] for p in path))
            if row is None:
                continue
            level = peak = 0
            for t, size in deltas:
                if t0 <= t <= t1:
                    level += size
                    peak = max(peak, level)
            compared += 1
            same += peak == row.peak_bytes
            assert row.peak_bytes <= peak, row.name
        assert compared == len(rows) and same >= compared - 1, type(conv).__name__


def test_the_table_page_trace_run_view_and_diff(tmp_path):
    pytest.importorskip("torch_geometric")
    from .browser import body_data, open_page

    script = str(ROOT / "tests" / "scripts" / "plain_pyg.py")
    for name, epochs in (("a", "2"), ("b", "1")):
        proc = run_script(
            "-m", "instrumented_convs", "run", "--memory", "-o", str(tmp_path / name), script,
            "--epochs", epochs,
        )  # fmt: skip
    assert "--- Memory: kept for backward" in proc.stdout
    run = json.loads((tmp_path / "b" / "run.json").read_text())
    rows = {(r["name"], r["phase"]): r for r in run["summary"]["rows"]}
    gat = rows[("forward/GATConv", "forward")]
    assert gat["saved_bytes"] > 0 and gat["peak_bytes"] > 0 and gat["mem_calls"] == gat["count"]
    assert rows[("data", "forward")]["saved_bytes"] == 0  # the batch is the data
    assert rows[("backward/GATConv", "backward")]["peak_bytes"] > 0
    view = run_script("-m", "instrumented_convs", "view", str(tmp_path / "b"), "--memory")
    assert re.search(r"- GATConv +\| +\d+ \| +[\d.]+ KiB", view.stdout)
    text = run_script("-m", "instrumented_convs", "view", str(tmp_path / "b")).stdout
    assert "Saved/call" in text and "Peak" in text
    trace = json.loads(gzip.decompress((tmp_path / "b" / "trace.json.gz").read_bytes()))
    counter = [e for e in trace["traceEvents"] if e.get("ph") == "C"]
    assert counter and max(e["args"]["bytes"] for e in counter) > 0
    diff = run_script("-m", "instrumented_convs", "diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert "--- memory: kept for backward per call, and peak" in diff.stdout
    assert re.search(r"- GATConv .*\| unchanged", diff.stdout)
    dom, console = open_page(tmp_path / "b" / "page.html")
    assert console == [] and body_data(dom) == {"ready": "1", "errors": "0"}
    assert "Where the memory goes" in dom
    memory_rects = re.findall(r'data-rects="(\d+)"', dom)[1]
    kept = [r for r in run["summary"]["rows"] if r["phase"] == "forward"]
    assert int(memory_rects) >= 1 + sum(1 for r in kept if r["saved_bytes"])


def test_a_region_around_layers_gets_what_is_made_between_them():
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import GCNConv

    ei, x, _ = _graph()
    c1, c2 = GCNConv(F, C), GCNConv(C, C)
    with configure(memory=True):
        with region("model"):
            h = c1(x, ei)
            h = torch.relu(h)  # made between the layers, saved by ReLU's backward and c2's lin
            out = c2(h, ei)
        out.sum().backward()
    rows = {r.name: r for r in registry.summary().rows if r.phase == "forward"}
    own = rows["model"].saved_bytes - rows["model/GCNConv"].saved_bytes
    # c1's output is saved by ReLU (its result: made in the region); c2's lin saves h
    assert own == F4 * N * C
    assert rows["model/GCNConv"].count == 2


@pytest.mark.skipif(
    not hasattr(torch.utils._python_dispatch.TorchDispatchMode, "ignore_compile_internals"),
    reason="torch.compile skips frames under any dispatch mode before torch 2.8",
)
def test_a_compiled_model_compiles_as_stock_and_its_calls_memory_is_recorded(tmp_path):
    """Dynamo's own counters (frames, graph breaks, graphs...) of a compiled GCN trained a
    few steps: the same plainly and under ``run --memory``, and so are its outputs."""
    pytest.importorskip("torch_geometric")
    probe = str(ROOT / "tests" / "scripts" / "compiled_probe.py")
    run_script(probe, "gcn", str(tmp_path / "stock.json"), timeout=600)
    run_script(
        "-m", "instrumented_convs", "run", "--memory", "--quiet", "-o", str(tmp_path / "run"),
        probe, "gcn", str(tmp_path / "memory.json"), timeout=600,
    )  # fmt: skip
    stock, ours = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("stock", "memory"))
    keys = ("frames", "frames_ok", "graph_breaks", "graphs", "captured", "recompile_limit")
    assert {k: ours[k] for k in keys} == {k: stock[k] for k in keys} and stock["graphs"] > 0
    assert ours["outputs"] == stock["outputs"]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    rows = {(r["name"], r["phase"]): r for r in run["summary"]["rows"]}
    compiled = rows[("forward/compiled GCN", "forward")]
    assert compiled["saved_bytes"] > 0 and compiled["peak_bytes"] > 0


def test_gcnconv_backward_rows_peak_at_what_each_steps_backward_allocates():
    """A backward row's peak: the gradients its backward makes, counted by hand."""
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import GCNConv

    ei, x, _ = _graph()
    e = E + N
    with configure(memory=True, backward_every=1):
        GCNConv(F, C)(x, ei).sum().backward()
    peak = {r.name: r.peak_bytes for r in registry.summary().rows if r.phase == "backward"}
    assert peak["GCNConv/propagate/aggregate"] == F4 * e * C  # the gradient gathered to edges
    assert peak["GCNConv/propagate/message"] == F4 * e * C  # times the weights: x_j's
    # summed back onto the nodes: index_select's backward adds into zeros, out of place
    assert peak["GCNConv/propagate/collect"] == 2 * F4 * N * C
    assert peak["GCNConv/lin"] == F4 * F * C  # the weight's (the data needs none)
    assert all(r.saved_bytes == 0 for r in registry.summary().rows if r.phase == "backward")


def test_on_cuda_the_peak_is_the_allocators_count(monkeypatch):
    """Where CUDA is available the level is ``torch.cuda.memory_allocated()`` (everything on
    the device): here a stand-in that counts twice the noted bytes, plus what was there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "memory_allocated", lambda device=None: 1000 + 2 * memory._alive
    )
    w = torch.randn(8, requires_grad=True)
    with configure(memory=True):
        with step("make"):
            (w * 2).exp()  # 8 floats, then 8 more
    assert registry.summary()["make"].peak_bytes == 2 * 2 * F4 * 8


def test_counters_and_memory_share_one_mode_turned_on_and_off_in_any_order():
    stack = torch._C._len_torch_dispatch_stack
    w = torch.randn(8, requires_grad=True)
    assert stack() == 0
    configure(memory=True)
    configure(counters=True)  # the counting mode in place of memory's own: still one
    assert stack() == 1
    with step("make"):
        (w * 2).exp()
    configure(memory=False)
    assert stack() == 1 and not memory.is_on()
    configure(memory=True)
    configure(counters=False)  # memory's own mode again
    assert stack() == 1
    with step("again"):
        (w * 3).exp()
    configure(memory=False)
    assert stack() == 0
    rows = registry.summary()
    # the counters' ops as without memory: mul, exp, and the detach of what exp saves (our
    # pack hook's, in place of autograd's own; torch 2.2 dispatches a detach twice: one more)
    with configure(counters=True):
        with step("counted alone"):
            (w * 2).exp()
    alone = registry.summary()["counted alone"]
    assert rows["make"].ops - alone.ops == _detach_dispatches() - 1
    assert (rows["make"].flops, rows["make"].bytes_read) == (alone.flops, alone.bytes_read)
    assert rows["make"].peak_bytes == 2 * F4 * 8
    assert rows["again"].ops == 0 and rows["again"].peak_bytes == 2 * F4 * 8


def _detach_dispatches() -> int:
    """How many times one ``detach()`` reaches a dispatch mode on this torch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.ones(1, requires_grad=True)
    with Seen():
        x.detach()
    return len(seen)
