"""The counters: FLOPs, bytes and memory per step, exact on CPU; the roofline table and plot."""

from __future__ import annotations

import pytest
import torch

from instrumented_convs import configure, region, registry
from instrumented_convs.core.storage.entry import EntryStats
from instrumented_convs.layers import mark_outputs, step
from instrumented_convs.report.roofline import Peak
from instrumented_convs.report.stats import summarize
from instrumented_convs.testing import FakeClock, cpu_clock

F4, I8 = 4, 8  # bytes of a float32 and of an int64


def counted(path, phase="forward"):
    row = next(r for r in registry.summary() if r.name == path and r.phase == phase)
    return row.flops, row.bytes_read, row.bytes_written


def test_off_by_default_nothing_is_counted():
    with step("a"):
        torch.ones(3) + 1
    row = registry.summary()["a"]
    assert (row.ops, row.flops) == (0, 0)
    assert "nothing counted" in registry.summary().table(counters=True)


def test_a_lin_step_is_2_n_fin_fout_flops_and_its_operands_bytes():
    n, fin, fout = 50, 16, 8
    x = torch.randn(n, fin)
    lin, lin_b = torch.nn.Linear(fin, fout, bias=False), torch.nn.Linear(fin, fout)
    with configure(counters=True):
        with step("lin"):
            lin(x)
        with step("lin_bias"):
            lin_b(x)
    assert counted("lin") == (2 * n * fin * fout, (n * fin + fin * fout) * F4, n * fout * F4)
    assert counted("lin_bias") == (
        2 * n * fin * fout + n * fout,  # addmm: the bias added to every output
        (n * fin + fin * fout + fout) * F4,
        n * fout * F4,
    )


def test_gathers_scatters_and_elementwise_ops():
    n, e, f = 20, 60, 4
    x = torch.randn(n, f)
    idx = torch.randint(0, n, (e,))
    with configure(counters=True):
        with step("gather"):
            rows = x.index_select(0, idx)
        with step("scatter"):
            out = torch.zeros(n, f)
            out.index_add_(0, idx, rows)
        with step("mul"):
            rows * 2.0
        with step("copies"):
            rows.clone()
            rows.repeat(2, 1)
            torch.empty(e, f).copy_(rows)
    assert counted("gather") == (0, e * f * F4 + e * I8, e * f * F4)
    # zeros writes the destination, index_add_ reads and writes it, reads source and index
    assert counted("scatter") == (e * f, n * f * F4 + e * f * F4 + e * I8, 2 * n * f * F4)
    assert counted("mul") == (e * f, e * f * F4, e * f * F4)
    # clone, repeat (twice the rows written), copy_ into a new tensor: read once, written
    assert counted("copies") == (0, 3 * e * f * F4, (1 + 2 + 1) * e * f * F4)


def test_a_step_counts_its_childrens_ops_and_the_backward_its_own():
    n, fin, fout = 30, 6, 4
    lin = torch.nn.Linear(fin, fout, bias=False)
    x = torch.randn(n, fin)
    with configure(counters=True):
        assert configure().backward_every == 1  # every backward timed, each op in its step
        with region("step"):
            with step("layer"):
                with step("lin"):
                    h = mark_outputs(lin(x))
                out = mark_outputs(h.relu().sum())
            out.backward()
    mm = 2 * n * fin * fout
    f, r, w = counted("step/layer")
    assert f == mm + n * fout + n * fout  # mm, relu (one per element), sum (one per input)
    assert counted("step/layer/lin")[0] == mm
    # lin's backward: the gradient of the weight (grad^T @ x), x needs none
    assert counted("step/layer/lin", "backward")[0] == 2 * fout * n * fin
    s = registry.summary()
    # the region holds the forward and, below it, the backward: relu's (threshold_backward,
    # one per element) and lin's
    assert s["step"].flops == f + n * fout + 2 * fout * n * fin
    assert counted("step/layer", "backward")[0] == n * fout + 2 * fout * n * fin


def test_an_op_without_a_formula_is_listed_never_zero_silently():
    a = torch.randn(4, 4) + 4 * torch.eye(4)
    with configure(counters=True):
        with step("solve"):
            torch.linalg.inv(a)
    row = registry.summary()["solve"]
    assert "aten.linalg_inv_ex:1" in row.unknown
    text = registry.summary().table(counters=True)
    assert "solve: no formula for " in text and "aten.linalg_inv_ex x1" in text


def test_the_roofline_columns_from_a_fixed_peak_are_exact():
    stats = [
        EntryStats(
            "lin",
            "lin",
            None,
            "step",
            0,
            -1,
            2,
            2_000_000,
            2_000_000_000_000,
            1_000_000,
            1_000_000,
            0,
            0,
            flops=4_000_000,
            bytes_read=1_000_000,
            bytes_written=1_000_000,
            ops=2,
            alloc_bytes=500_000,
        ),
        EntryStats(
            "agg",
            "agg",
            None,
            "step",
            0,
            -1,
            1,
            4_000_000,
            16_000_000_000_000,
            4_000_000,
            4_000_000,
            0,
            0,
            flops=1_000,
            bytes_read=30_000_000,
            bytes_written=10_000_000,
            ops=3,
            unknown="aten.foo:2",
        ),
    ]
    text = summarize(stats, unit="ms").table(counters=True, peak=Peak(10.0, 1.0, "fixed"))
    lines = text.splitlines()
    assert [c.strip() for c in lines[1].split("|")[1:]] == [
        "Count",
        "Time/call",
        "FLOP",
        "Bytes",
        "FLOP/B",
        "GFLOP/s",
        "GB/s",
        "Bound",
        "Roof/call",
        "x roof",
        "Alloc",
    ]
    # lin: 4 MFLOP in 2 ms: 2 GFLOP/s; 2 MB: 1 GB/s; roof: 4e6 / 1e9 = 4 ms > 2e6 / 1e10
    assert [c.strip() for c in lines[2].split("|")[1:]] == [
        "2",
        "1.000",
        "4M",
        "2M",
        "2",
        "2",
        "1",
        "compute",
        "2.000",
        "0.5",
        "500k",
    ]
    # agg: 40 MB in 4 ms: 10 GB/s, at the memory roof (4 ms): x roof 1
    assert [c.strip() for c in lines[3].split("|")[1:]] == [
        "1",
        "4.000",
        "1k",
        "40M",
        "2.5e-05",
        "0.00025",
        "10",
        "memory",
        "4.000",
        "1",
        "0",
    ]
    assert "10.0 GB/s, 1.0 GFLOP/s: fixed" in text
    assert "agg: no formula for aten.foo x2" in text


def test_counters_survive_saving_and_merging_ranks():
    from instrumented_convs.report import Summary
    from instrumented_convs.report.stats import merge_ranks

    with configure(counters=True):
        with cpu_clock(FakeClock()):
            with step("a"):
                torch.ones(10) * 3
    snap = registry.snapshot()
    s = summarize(snap)
    assert Summary.from_json(s.to_json())["a"].flops == s["a"].flops == 10
    assert merge_ranks([snap, snap])["a"].flops == 20


def test_turning_them_off_restores_the_sampling_and_counts_no_more():
    saved = configure(counters=True)
    assert configure().counters is True
    saved.restore()
    assert configure().counters is False and configure().backward_every == saved.backward_every
    with step("after"):
        torch.ones(3) + 1
    assert registry.summary()["after"].ops == 0
    with pytest.raises(ValueError):
        configure(timeline=-1)


def test_gcnconv_forward_hand_computed():
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import GCNConv

    torch.manual_seed(0)
    n, e, fin, h = 12, 40, 5, 3
    src = torch.randint(0, n, (e,))
    ei = torch.stack([src, (src + torch.randint(1, n, (e,))) % n])
    conv = GCNConv(fin, h, normalize=False)
    with configure(counters=True):
        conv(torch.randn(n, fin), ei)
    assert counted("GCNConv/lin") == (2 * n * fin * h, (n * fin + fin * h) * F4, n * h * F4)
    # the source rows gathered for each edge (PyG's collect: index_select of x by row 0)
    assert counted("GCNConv/propagate/collect") == (0, e * h * F4 + e * I8, e * h * F4)
    assert counted("GCNConv/propagate/message") == (0, 0, 0)  # no edge weight: x_j itself
    # sum aggregation: zeros, then scatter_add_ of one value per edge and channel
    assert counted("GCNConv/propagate/aggregate") == (
        e * h,
        n * h * F4 + e * I8 + e * h * F4,
        2 * n * h * F4,
    )
    assert counted("GCNConv/bias") == (n * h, (n * h + h) * F4, n * h * F4)
    assert counted("GCNConv")[0] == 2 * n * fin * h + e * h + n * h


def test_run_counters_saves_the_peak_and_view_prints_the_roofline(tmp_path):
    pytest.importorskip("torch_geometric")
    from .helpers import ROOT, run_script

    script = str(ROOT / "tests" / "scripts" / "plain_pyg.py")
    env = {"INSTRUMENTED_CONVS_CACHE": str(tmp_path / "cache")}  # the probe's cache
    proc = run_script(
        "-m",
        "instrumented_convs",
        "run",
        "--counters",
        "--peak-gbs",
        "50",
        "-o",
        "out",
        script,
        "--epochs",
        "1",
        cwd=tmp_path,
        env=env,
    )
    assert "x roof" in proc.stdout and "Roof: the time at the machine's limit" in proc.stdout
    assert "times measured with the counters on" in proc.stdout  # said: they slow it down
    run = __import__("json").loads((tmp_path / "out" / "run.json").read_text())
    # the bandwidth given, the arithmetic peak probed on the device the script used: the CPU
    assert run["peak"]["gbs"] == 50 and run["peak"]["gflops"] > 0
    assert run["peak"]["source"].startswith("50 GB/s given; the rest from the probe on ")
    assert "(cpu, torch threads" in run["peak"]["source"]
    assert run["settings"]["counters"] is True and run["settings"]["backward_every"] == 1
    view = run_script(
        "-m",
        "instrumented_convs",
        "view",
        "out",
        "--counters",
        "--peak-gbs",
        "10",
        "--peak-tflops",
        "2",
        cwd=tmp_path,
    )
    lines = {line.split("|")[0].strip() for line in view.stdout.splitlines() if "|" in line}
    assert {"- forward", "- GCNConv", "- lin", "- aggregate"} <= lines
    assert "no formula" not in view.stdout  # every op of this script has a formula
    assert "(10.0 GB/s, 2000.0 GFLOP/s: 10 GB/s given, 2 TFLOP/s given)" in view.stdout


def test_the_peak_given_in_place_of_the_probe_and_on_which_device_it_is_probed(monkeypatch):
    import argparse

    from instrumented_convs import roofline
    from instrumented_convs.commands.errors import UserError
    from instrumented_convs.commands.launch import peaks

    probed = Peak(20.0, 100.0, "probe on here")
    assert roofline.given(probed) is probed
    assert roofline.given(probed, tflops=0.5) == Peak(
        20.0, 500.0, "0.5 TFLOP/s given; the rest from the probe on here"
    )
    assert roofline.given(None, 1, 2) == Peak(1, 2000, "1 GB/s given, 2 TFLOP/s given")
    with pytest.raises(ValueError):
        roofline.given(None, gbs=1)
    seen = []
    monkeypatch.setattr(peaks, "probe", lambda device: seen.append(device) or probed)
    args = argparse.Namespace(peak_gbs=None, peak_tflops=None)
    assert peaks.run_peak(args) is probed and seen == ["cpu"]
    # a script that used CUDA is read against its GPU: the probe runs there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    peaks.run_peak(args)
    assert seen == ["cpu", "cuda"]
    peaks.run_peak(argparse.Namespace(peak_gbs=3.0, peak_tflops=4.0))  # both given: no probe
    assert seen == ["cpu", "cuda"]
    with pytest.raises(UserError, match="--peak-gbs takes a positive number"):
        peaks.run_peak(argparse.Namespace(peak_gbs=-1.0, peak_tflops=None))


def test_the_probe_says_on_which_device_it_ran(tmp_path, monkeypatch):
    from instrumented_convs import roofline

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        roofline.probe(device="cuda", folder=tmp_path)
    monkeypatch.setattr(roofline, "_MB", 1 << 12)  # a small copy: this test is about the source
    peak = roofline.probe(folder=tmp_path)
    assert peak.gbs > 0 and peak.gflops > 0
    assert f"(cpu, torch threads {torch.get_num_threads()})" in peak.source
    assert roofline.probe(folder=tmp_path) == peak  # cached


def test_dgl_kernels_the_dispatcher_cannot_see_are_listed_forward_and_backward():
    dgl = pytest.importorskip("dgl")
    from instrumented_convs.dgl import GraphConv

    g = dgl.add_self_loop(dgl.rand_graph(20, 60))
    conv = GraphConv(5, 3)
    x = torch.randn(20, 5)
    with configure(counters=True):
        with region("step"):
            out = conv(g, x)
            with region("bw"):
                out.sum().backward()
    s = registry.summary()
    forward = s["step/GraphConv"]
    backward = next(r for r in s if r.name == "step/bw/GraphConv" and r.phase == "backward")
    # DGL's fused kernel, outside torch's dispatcher, counted by its formula: one FLOP per
    # edge and channel for the sum (copy_u: none for the message); the graph's indices and
    # the source features read once
    n, e, fin, h = 20, g.num_edges(), 5, 3
    update = s["step/GraphConv/update_all"]
    assert update.flops == e * h and update.bytes_read == 2 * e * 8 + n * h * 4
    # the result zero-filled (DGL allocates it with zeros), then written by the kernel
    assert update.bytes_written == 2 * n * h * 4
    # DGL's degree queries run in its C library: listed by name (the zero-in-degree check
    # and the destination norm's in-degrees, the source norm's out-degrees), never zero
    assert forward.unknown == "dgl.in_degrees:2;dgl.out_degrees:1"
    # its backward: the same kernel on the reversed graph, counted by the same formula
    bw_update = next(r for r in s if r.name == "step/bw/GraphConv/update_all")
    assert (bw_update.phase, bw_update.flops) == ("backward", e * h)
    # the whole backward (x needs no gradient): the bias's sum, the mul by the destination
    # norm, the kernel, the weight's gradient (x^T @ grad)
    assert backward.flops == n * h + n * h + e * h + 2 * fin * n * h
    with configure(counters=True):
        with step("softmax"):
            dgl.ops.edge_softmax(g, torch.randn(g.num_edges(), 1))
    assert "dgl.edge_softmax:1" in registry.summary()["softmax"].unknown  # no formula: listed


def test_times_from_a_run_without_counters_with_the_flops_per_call():
    counted_stats = [
        EntryStats(
            "agg",
            "agg",
            None,
            "step",
            0,
            -1,
            2,
            8_000_000,
            32_000_000_000_000,
            4_000_000,
            4_000_000,
            0,
            0,
            flops=2_000,
            bytes_read=30_000_000,
            bytes_written=10_000_000,
            ops=6,
            alloc_bytes=3_000,
        ),
    ]
    timed_stats = [  # 4 calls of 1 ms each, without the counters' overhead
        EntryStats(
            "agg",
            "agg",
            None,
            "step",
            0,
            -1,
            4,
            4_000_000,
            4_000_000_000_000,
            1_000_000,
            1_000_000,
            0,
            0,
        ),
    ]
    counted, timed = summarize(counted_stats, unit="ms"), summarize(timed_stats, unit="ms")
    text = counted.table(counters=True, peak=Peak(40.0, 1.0, "fixed"), times=timed)
    row = [c.strip() for c in text.splitlines()[2].split("|")[1:]]
    # 20 MB a call over 4 calls: 80 MB in 4 ms = 20 GB/s, half the 40 GB/s roof: x roof 2;
    # 1.5 kB allocated a call
    assert row == [
        "4",
        "1.000",
        "4k",
        "80M",
        "5e-05",
        "0.001",
        "20",
        "memory",
        "0.500",
        "2",
        "6k",
    ]
    assert "times from a run without them" in text.splitlines()[0]


def test_sparse_times_dense_is_2_nnz_m_flops_forward_and_backward():
    torch.manual_seed(0)
    a = torch.randn(6, 5).relu().to_sparse_csr().requires_grad_()
    d = torch.randn(5, 4, requires_grad=True)
    nnz = a.values().numel()
    with configure(counters=True):
        with step("spmm"):
            out = mark_outputs(torch.sparse.mm(a, d, "sum"))
        out.sum().backward()
    flops, read, written = counted("spmm")
    assert flops == 2 * nnz * 4 and written == 6 * 4 * F4
    sparse = (7 + nnz) * I8 + nnz * F4  # crow, col, values
    assert read == sparse + 5 * 4 * F4  # and the dense rows
    # both gradients asked for, each a product of the same size; reads the sparse operand,
    # the incoming gradient (sum's: one broadcast value) and the dense operand; writes the
    # sparse gradient (its indices and values) and the dense one
    assert counted("spmm", "backward") == (
        2 * (2 * nnz * 4),
        sparse + F4 + 5 * 4 * F4,
        sparse + 5 * 4 * F4,
    )
    assert not registry.summary()["spmm"].unknown


# -- formulas, each against a hand count --------------------------------------------------------


def _cost(fn):
    """The (FLOPs, bytes read, bytes written) of what ``fn`` runs, in one step."""
    registry.reset()
    with configure(counters=True):
        with step("op"):
            fn()
    return counted("op")


def test_dense_times_sparse_is_2_nnz_times_the_dense_rows():
    torch.manual_seed(0)
    sparse = (torch.randn(10, 8) * (torch.rand(10, 8) < 0.2)).to_sparse().coalesce()
    nnz = sparse._nnz()
    dense = torch.randn(6, 10)  # 6 x 10 @ 10 x 8: each stored element meets the 6 dense rows
    flops, read, written = _cost(lambda: torch.mm(dense, sparse))
    assert flops == 2 * nnz * 6
    assert read == 2 * nnz * I8 + nnz * F4 + 6 * 10 * F4  # COO indices, values, dense
    assert written == 6 * 8 * F4


def test_sparse_times_sparse_counts_the_products_of_matching_entries():
    # a: 3 x 3 with entries (0,0) (1,0) (2,1); b: 3 x 2 with (0,0) (0,1) (1,1)
    a = torch.sparse_coo_tensor([[0, 1, 2], [0, 0, 1]], [1.0, 2.0, 3.0], (3, 3)).coalesce()
    b = torch.sparse_coo_tensor([[0, 0, 1], [0, 1, 1]], [4.0, 5.0, 6.0], (3, 2)).coalesce()
    # column 0 of a (2 entries) meets row 0 of b (2): 4 products; column 1 (1) meets row 1
    # (1): 1; column 2 meets nothing. A multiply and an add each.
    assert _cost(lambda: torch.sparse.mm(a, b))[0] == 2 * (2 * 2 + 1 * 1)


def test_softmax_backward_reads_the_gradient_and_the_forward_output():
    x = torch.randn(7, 4, requires_grad=True)
    with configure(counters=True):
        y = torch.softmax(x, -1)
        grad = torch.ones_like(y)
        with step("bw"):
            torch.autograd.grad(y, x, grad)
    flops, read, written = counted("bw")
    # grad * out, its row sums, the difference, times out: 4 FLOPs an element
    assert (flops, read, written) == (4 * 28, 2 * 28 * F4, 28 * F4)


def test_native_dropout_is_one_flop_per_element_and_writes_its_mask():
    x = torch.randn(7, 4)
    flops, read, written = _cost(lambda: torch.native_dropout(x, 0.5, True))
    assert (flops, read, written) == (28, 28 * F4, 28 * F4 + 28 * 1)  # output float, mask bool


def test_nll_loss_is_one_flop_per_sample_and_reads_only_the_picked_values():
    n, c = 7, 4
    logp = torch.randn(n, c).log_softmax(-1).requires_grad_()
    target = torch.randint(0, c, (n,))
    with configure(counters=True):
        with step("loss"):
            loss = torch.nn.functional.nll_loss(logp, target)
        with step("bw"):
            torch.autograd.grad(loss, logp)
    # forward: the n picked log-probabilities summed (and the mean), the targets read;
    # writes the loss and the total weight (two scalars)
    assert counted("loss") == (n, n * F4 + n * I8, 2 * F4)
    # backward (and the ones_like of the scalar gradient: one write): the gradient of every
    # sample's picked value; reads the scalar gradient, the targets, the total weight;
    # writes the zero-filled n x c gradient
    flops, read, written = counted("bw")
    assert (flops, read, written) == (n, 2 * F4 + n * I8, F4 + n * c * F4)


def test_turning_the_counters_off_puts_the_backward_sampling_back():
    configure(backward_every=5)
    configure(counters=True)
    assert configure().backward_every == 1  # every backward timed while they count
    configure(counters=False)
    assert configure().backward_every == 5
    # a value the user gives while they are on is the user's: kept when they go off
    configure(counters=True)
    configure(backward_every=3)
    configure(counters=False)
    assert configure().backward_every == 3
    with configure(counters=True, backward_every=7):  # given with them: used, then undone
        assert configure().backward_every == 7
    assert configure().backward_every == 3 and configure().counters is False


def test_by_layer_an_unknown_op_is_listed_once_under_its_own_step():
    # region "step" (no layer) > GraphConv (layer G) > edge_softmax, whose op has no formula
    stats = [
        EntryStats("step", "step", None, "region", 0, -1, 1, 10, 100, 10, 10, 0, 0),
        EntryStats(
            "GraphConv",
            "step/GraphConv",
            "G",
            "step",
            1,
            0,
            1,
            8,
            64,
            8,
            8,
            0,
            0,
            flops=6,
            bytes_read=24,
            bytes_written=24,
            ops=1,
        ),
        EntryStats(
            "edge_softmax",
            "step/GraphConv/edge_softmax",
            "G",
            "step",
            2,
            1,
            1,
            4,
            16,
            4,
            4,
            0,
            0,
            ops=1,
            unknown="dgl.edge_softmax:1",
        ),
    ]
    for by in ("step", "layer"):
        text = summarize(stats, by=by).table(counters=True)
        assert [line for line in text.splitlines() if "no formula" in line] == [
            "step/GraphConv/edge_softmax: no formula for dgl.edge_softmax x1 (not in its FLOP "
            "and bytes)"
        ], by


def test_the_table_says_when_its_times_are_the_counted_runs_own():
    stats = [
        EntryStats(
            "agg",
            "agg",
            None,
            "step",
            0,
            -1,
            1,
            4_000_000,
            16_000_000_000_000,
            4_000_000,
            4_000_000,
            0,
            0,
            flops=1_000,
            bytes_read=30_000_000,
            bytes_written=10_000_000,
            ops=3,
        ),
    ]
    text = summarize(stats, unit="ms").table(counters=True, peak=Peak(10.0, 1.0, "fixed"))
    assert "times measured with the counters on" in text.splitlines()[0]
    assert "slower than without them" in text


def test_a_scatter_that_copies_does_no_arithmetic_one_that_adds_does_one_per_source():
    dest = torch.zeros(10, dtype=torch.int64)
    mask = torch.tensor([True, False] * 5)
    vals = torch.arange(5)
    # integer copy into 5 places: no FLOPs; reads the mask and the values, writes the tensor
    assert _cost(lambda: dest.index_put_((mask,), vals)) == (0, 10 + 5 * I8, 10 * I8)
    x, idx, src = torch.zeros(6, 3), torch.tensor([0, 2, 2, 5]), torch.ones(4, 3)
    assert _cost(lambda: x.index_copy_(0, torch.tensor([1, 3]), src[:2])) == (
        0,
        2 * I8 + 2 * 3 * F4,
        6 * 3 * F4,
    )
    # accumulating: an add per source element; the destination read and written
    assert _cost(lambda: x.index_put_((idx,), src, accumulate=True)) == (
        4 * 3,
        6 * 3 * F4 + 4 * I8 + 4 * 3 * F4,
        6 * 3 * F4,
    )


# -- torch-sparse and torch-scatter: ops a dispatch mode cannot see ------------------------------


@pytest.mark.sparse
def test_torch_sparse_and_scatter_ops_are_counted_where_they_are_called():
    from torch_sparse import SparseTensor, matmul

    n, f = 6, 4
    row = torch.tensor([0, 0, 1, 3, 3, 3, 5])
    col = torch.tensor([1, 2, 0, 0, 4, 5, 2])
    nnz = row.numel()
    adj = SparseTensor(row=row, col=col, value=torch.rand(nnz), sparse_sizes=(n, n))
    adj.fill_cache_()  # rowptr, colptr, csr2csc... built here, outside the steps
    x = torch.randn(n, f)
    with configure(counters=True):
        with step("spmm"):
            matmul(adj, x, reduce="sum")
        with step("degree"):  # a weighted degree: torch-scatter's segment_sum_csr
            adj.sum(dim=1)
    # a multiply and an add per stored element and column; reads rowptr, col, value and x
    assert counted("spmm") == (
        2 * nnz * f,
        (n + 1) * I8 + nnz * I8 + nnz * F4 + n * f * F4,
        n * f * F4,
    )
    # one add per stored value; reads the values and rowptr, writes one sum per row
    assert counted("degree") == (nnz, nnz * F4 + (n + 1) * I8, n * F4)
    s = registry.summary()
    assert not s["spmm"].unknown and not s["degree"].unknown


@pytest.mark.sparse
def test_an_extension_op_without_formula_and_a_cpp_backward_are_listed_by_name():
    import torch_sparse  # noqa: F401  (loads its ops)
    from torch_sparse import SparseTensor, matmul

    row, col = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
    adj = SparseTensor(row=row, col=col, value=torch.ones(3), sparse_sizes=(3, 3))
    adj.fill_cache_()
    x = torch.randn(3, 2, requires_grad=True)
    with configure(counters=True):
        with step("relabel"):
            torch.ops.torch_sparse.relabel(col, torch.tensor([0, 2]))
        with step("spmm"):
            out = mark_outputs(matmul(adj, x, reduce="sum"))
        out.sum().backward()
    s = registry.summary()
    assert s["relabel"].unknown == "torch_sparse.relabel:1"
    text = s.table(counters=True)
    assert "relabel: no formula for torch_sparse.relabel x1" in text
    bw = next(r for r in s if r.name == "spmm" and r.phase == "backward")
    assert bw.unknown == "torch_sparse.spmm_sum.backward:1"  # its C++ kernel: listed


# -- memory per step ----------------------------------------------------------------------------


def test_cpu_memory_is_the_bytes_of_the_tensors_each_step_allocated():
    n, f, h = 10, 4, 3
    x = torch.randn(n, f, requires_grad=True)
    w = torch.randn(f, h, requires_grad=True)
    with configure(counters=True):
        with step("fwd"):
            y = x @ w  # a new n x h tensor
            y.view(-1)  # a view: nothing
            y.add_(1)  # in place: nothing
            y = mark_outputs(y.relu())  # a new n x h
        grad = torch.ones_like(y)
        with region("bw"):
            y.backward(grad)
    s = registry.summary()
    assert s["fwd"].alloc_bytes == 2 * n * h * F4
    # relu's gradient (n x h), then the weight's (f x h) and the input's (n x f)
    bw = next(r for r in s if r.name == "bw/fwd" and r.phase == "backward")
    assert bw.alloc_bytes == (n * h + f * h + n * f) * F4
    assert s["bw"].alloc_bytes == bw.alloc_bytes  # a region holds its children's
    assert s["fwd"].cuda_calls == 0  # no CUDA here: no allocator readings
    text = s.table(counters=True)
    assert "Alloc" in text.splitlines()[1] and "Left/call" not in text


class FakeAllocator:
    """``torch.cuda.memory_allocated`` that returns scripted readings, one per call."""

    def __init__(self, readings):
        self.readings = list(readings)

    def __call__(self, device=None):
        return self.readings.pop(0)


@pytest.fixture
def fake_cuda_memory(monkeypatch):
    """CUDA "available", the allocator scripted, and anything that would synchronize or touch
    the user's peak statistics forbidden."""

    def forbidden(*args, **kwargs):
        raise AssertionError("called a CUDA function the counters must not call")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("synchronize", "reset_peak_memory_stats", "reset_max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    allocator = FakeAllocator([])
    monkeypatch.setattr(torch.cuda, "memory_allocated", allocator)
    return allocator


def test_cuda_memory_left_and_peak_per_call_from_the_allocator(fake_cuda_memory):
    x = torch.ones(4)
    # two readings per op in a step (before, after): outer's a; inner's b, c; outer's d
    fake_cuda_memory.readings = [1000, 1016, 1016, 1032, 1032, 1048, 1032, 1036]
    with configure(counters=True):
        with step("outer"):
            a = x * 2  # 1000 -> 1016
            with step("inner"):
                b = a + 1  # 1016 -> 1032
                c = b * b  # 1032 -> 1048 (inner's peak)
            del b  # freed between ops: 1048 -> 1032, seen before outer's next op
            c.sum()  # 1032 -> 1036
        assert fake_cuda_memory.readings == []
    s = registry.summary()
    inner, outer = s["outer/inner"], s["outer"]
    assert (inner.cuda_calls, inner.cuda_left, inner.cuda_peak) == (1, 1048 - 1016, 1048 - 1016)
    assert (outer.cuda_calls, outer.cuda_left, outer.cuda_peak) == (1, 1036 - 1000, 1048 - 1000)
    # a second call of outer: its own base; left adds up over calls, the peak is the largest
    fake_cuda_memory.readings = [500, 600]
    with configure(counters=True):
        with step("outer"):
            x * 3  # 500 -> 600
    outer = registry.summary()["outer"]
    assert (outer.cuda_calls, outer.cuda_left, outer.cuda_peak) == (2, 36 + 100, 100)
    header = registry.summary().table(counters=True).splitlines()[1]
    assert header.split("|")[-2:] == [" Left/call ", " Peak"]


# -- whole layers, forward and backward, every step's row by hand ------------------------------
# A graph of n nodes and e directed edges, none a self loop; x (n x fin) needs a gradient; the
# backward is driven by a given gradient (made outside the steps). Below, E = e + n: the edges
# with one self loop per node added.

N, EDGES, FIN, H = 12, 40, 5, 3
B1 = 1  # a bool


def _graph():
    torch.manual_seed(0)
    src = torch.randint(0, N, (EDGES,))
    return torch.stack([src, (src + torch.randint(1, N, (EDGES,))) % N])  # no self loops


def _run_layer(conv, *inputs):
    """Forward and backward of ``conv`` with counters on; every counted row's numbers."""
    with configure(counters=True):
        out = conv(*inputs)
        grad = torch.randn_like(out)
        out.backward(grad)
    return {
        (r.name, r.phase): (r.flops, r.bytes_read, r.bytes_written)
        for r in registry.summary()
        if r.ops
    }


def _assert_rows(rows, expected):
    """Every expected row exactly: the layer's own rows (forward, backward), which hold all
    its ops, and its steps'. Steps it may have besides (around its own code, issue 23 part 1)
    are finer parts of those totals, in its subtree."""
    assert {key: rows.get(key) for key in expected} == expected
    layer = next(iter(expected))[0]
    assert all(name == layer or name.startswith(layer + "/") for name, _ in rows)


def _sum(*costs):
    return tuple(sum(c[i] for c in costs) for i in range(3))


def _mm(n, k, m):
    """An n x k by k x m product: its FLOPs, the two operands read, the result written."""
    return 2 * n * k * m, (n * k + k * m) * F4, n * m * F4


def _gcn_propagate(n, E, h, weighted):
    """PyG's propagate with a sum over E edges of h channels (edge weights when
    ``weighted``), forward and backward, for x's gradient."""
    collect = (0, E * h * F4 + E * I8, E * h * F4)  # x_j = x[row]: rows gathered, index read
    message = (E * h, E * F4 + E * h * F4, E * h * F4) if weighted else (0, 0, 0)
    # zeros(n, h), then scatter_add_ of E rows by col (expanded: its E values read)
    aggregate = (E * h, n * h * F4 + E * I8 + E * h * F4, 2 * n * h * F4)
    backward = {
        "aggregate": (0, E * h * F4 + E * I8, E * h * F4),  # gather of the grad by col
        "message": message,  # the grad times the edge weights
        "collect": (E * h, n * h * F4 + E * I8 + E * h * F4, 2 * n * h * F4),  # index_add
    }
    return {"collect": collect, "message": message, "aggregate": aggregate}, backward


def test_gcnconv_edge_index_forward_and_backward_hand_computed():
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import GCNConv

    n, e, fin, h, E = N, EDGES, FIN, H, EDGES + N
    rows = _run_layer(GCNConv(fin, h), torch.randn(n, fin, requires_grad=True), _graph())
    self_loops = _sum(
        (e, 2 * e * I8, e * B1),  # row != col
        (0, 0, n * I8),  # arange(n)
        (0, n * I8, 2 * n * I8),  # repeated into a 2 x n loop index
        (0, 2 * e * I8 + e * B1, 2 * e * I8),  # edge_index[:, mask]: all e kept
        (0, 2 * e * I8 + 2 * n * I8, 2 * E * I8),  # cat
    )
    degree = _sum(
        (0, 0, E * F4),  # ones(E): the edge weights
        (0, 0, n * F4),  # zeros(n)
        (E, n * F4 + E * I8 + E * F4, n * F4),  # scatter_add_ by col
    )
    normalize = _sum(
        (n, n * F4, n * F4),  # deg.pow_(-0.5)
        (n, n * F4, n * B1),  # == inf
        (n, n * F4 + n * B1, n * F4),  # masked_fill_
        (0, E * F4 + E * I8, E * F4),  # deg_inv_sqrt[row]
        (E, 2 * E * F4, E * F4),  # times the weights
        (0, E * F4 + E * I8, E * F4),  # deg_inv_sqrt[col]
        (E, 2 * E * F4, E * F4),  # times
    )
    forward, backward = _gcn_propagate(n, E, h, weighted=True)
    lin, bias = _mm(n, fin, h), (n * h, n * h * F4 + h * F4, n * h * F4)
    # lin's backward: the weight's gradient grad^T @ x (h x n by n x fin), x's grad @ W
    lin_bw = _sum(_mm(h, n, fin), _mm(n, h, fin))
    bias_bw = (n * h, n * h * F4, h * F4)  # the gradient summed over the nodes
    norm = _sum(self_loops, degree, normalize)
    propagate, propagate_bw = _sum(*forward.values()), _sum(*backward.values())
    expected = {
        ("GCNConv", "forward"): _sum(norm, lin, propagate, bias),
        ("GCNConv/gcn_norm", "forward"): norm,
        ("GCNConv/gcn_norm/add_remaining_self_loops", "forward"): self_loops,
        ("GCNConv/gcn_norm/degree", "forward"): degree,
        ("GCNConv/gcn_norm/normalize", "forward"): normalize,
        ("GCNConv/lin", "forward"): lin,
        ("GCNConv/propagate", "forward"): propagate,
        **{(f"GCNConv/propagate/{k}", "forward"): v for k, v in forward.items()},
        ("GCNConv/bias", "forward"): bias,
        ("GCNConv", "backward"): _sum(bias_bw, propagate_bw, lin_bw),
        ("GCNConv/bias", "backward"): bias_bw,
        ("GCNConv/propagate", "backward"): propagate_bw,
        **{(f"GCNConv/propagate/{k}", "backward"): v for k, v in backward.items()},
        ("GCNConv/lin", "backward"): lin_bw,
    }
    _assert_rows(rows, expected)


def test_sageconv_forward_and_backward_hand_computed():
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import SAGEConv

    n, e, fin, h = N, EDGES, FIN, H
    rows = _run_layer(SAGEConv(fin, h), torch.randn(n, fin, requires_grad=True), _graph())
    # the mean of x's rows over the in-edges (aggregated before the transform: fin channels)
    collect = (0, e * fin * F4 + e * I8, e * fin * F4)  # x[row]
    aggregate = _sum(
        (0, 0, n * F4),  # zeros(n): the in-degree
        (0, 0, e * F4),  # ones(e)
        (e, n * F4 + e * I8 + e * F4, n * F4),  # scatter_add_ of the ones by col
        (n, n * F4, n * F4),  # clamp(min=1)
        (0, 0, n * fin * F4),  # zeros(n, fin)
        (e * fin, n * fin * F4 + e * I8 + e * fin * F4, n * fin * F4),  # scatter_add_
        (n * fin, n * fin * F4 + n * F4, n * fin * F4),  # / the degree (broadcast)
    )
    lin_l = _sum(_mm(n, fin, h), (n * h, h * F4, 0))  # addmm: the bias added, read
    lin_r = _mm(n, fin, h)
    add = (n * h, 2 * n * h * F4, n * h * F4)  # lin_l(mean) + lin_r(x), in the layer itself
    grads = _sum(_mm(h, n, fin), _mm(n, h, fin))  # a weight's gradient, then its input's
    lin_l_bw = _sum(grads, (n * h, n * h * F4, h * F4))  # and the bias's: a sum over nodes
    aggregate_bw = _sum(
        (n * fin, n * fin * F4 + n * F4, n * fin * F4),  # the gradient / the degree
        (0, e * fin * F4 + e * I8, e * fin * F4),  # gathered by col
    )
    collect_bw = _sum(
        (0, 0, n * fin * F4),  # zeros(n, fin)
        (e * fin, n * fin * F4 + e * I8 + e * fin * F4, n * fin * F4),  # index_add by row
    )
    propagate, propagate_bw = _sum(collect, aggregate), _sum(aggregate_bw, collect_bw)
    _assert_rows(
        rows,
        {
            ("SAGEConv", "forward"): _sum(propagate, lin_l, lin_r, add),
            ("SAGEConv/propagate", "forward"): propagate,
            ("SAGEConv/propagate/collect", "forward"): collect,
            ("SAGEConv/propagate/aggregate", "forward"): aggregate,
            ("SAGEConv/lin_l", "forward"): lin_l,
            ("SAGEConv/lin_r", "forward"): lin_r,
            ("SAGEConv", "backward"): _sum(grads, lin_l_bw, propagate_bw),
            ("SAGEConv/lin_r", "backward"): grads,
            ("SAGEConv/lin_l", "backward"): lin_l_bw,
            ("SAGEConv/propagate", "backward"): propagate_bw,
            ("SAGEConv/propagate/aggregate", "backward"): aggregate_bw,
            ("SAGEConv/propagate/collect", "backward"): collect_bw,
        },
    )


def test_gatconv_forward_and_backward_hand_computed():
    pytest.importorskip("torch_geometric")
    from instrumented_convs.pyg import GATConv

    n, e, fin, E = N, EDGES, FIN, EDGES + N
    heads, c = 2, H
    hc = heads * c
    conv = GATConv(fin, c, heads=heads)
    rows = _run_layer(conv, torch.randn(n, fin, requires_grad=True), _graph())
    lin = _mm(n, fin, hc)
    # alpha_src and alpha_dst: (x' * att).sum(-1), per node and head; then the bias
    alpha = _sum(
        (n * hc, n * hc * F4 + hc * F4, n * hc * F4), (n * hc, n * hc * F4, n * heads * F4)
    )
    own = _sum(alpha, alpha, (n * hc, n * hc * F4 + hc * F4, n * hc * F4))
    remove = _sum((e, 2 * e * I8, e * B1), (0, 2 * e * I8 + e * B1, 2 * e * I8))  # none found
    add_loops = _sum((0, 0, n * I8), (0, n * I8, 2 * n * I8), (0, 2 * (e + n) * I8, 2 * E * I8))
    per_edge = (E * heads, 2 * E * heads * F4, E * heads * F4)  # a binary op on E x heads
    unary = (E * heads, E * heads * F4, E * heads * F4)
    gather = (0, E * heads * F4 + E * I8, E * heads * F4)  # a node value per edge and head
    scatter = (E * heads, n * heads * F4 + E * I8 + E * heads * F4, n * heads * F4)
    zeros = (0, 0, n * heads * F4)
    alpha_collect = _sum(gather, gather)  # alpha_src[row], alpha_dst[col]
    edge_update = _sum(
        per_edge,
        unary,  # alpha_j + alpha_i, leaky_relu
        zeros,
        scatter,
        gather,  # the softmax: each destination's max (scatter_reduce_ amax)
        per_edge,
        unary,  # minus it, exp
        zeros,
        scatter,  # the sums
        (n * heads, n * heads * F4, n * heads * F4),  # + 1e-16
        gather,
        per_edge,  # each edge's sum, the division
    )
    collect = (0, E * hc * F4 + E * I8, E * hc * F4)  # x'[row]
    message = (E * hc, E * heads * F4 + E * hc * F4, E * hc * F4)  # alpha * x_j
    aggregate = _sum((0, 0, n * hc * F4), (E * hc, n * hc * F4 + E * I8 + E * hc * F4, n * hc * F4))
    message_bw = _sum(
        message,  # the gradient times alpha: x_j's
        (E * hc, 2 * E * hc * F4, E * hc * F4),  # the gradient times x_j
        (E * hc, E * hc * F4, E * heads * F4),  # summed over the channels: alpha's
    )
    aggregate_bw = (0, E * hc * F4 + E * I8, E * hc * F4)  # the gradient gathered by col
    collect_bw = _sum(
        (0, 0, n * hc * F4), (E * hc, n * hc * F4 + E * I8 + E * hc * F4, n * hc * F4)
    )  # index_add by row
    edge_update_bw = _sum(
        per_edge,
        per_edge,
        unary,
        per_edge,
        per_edge,  # the division's: two divs, neg, mul, div
        zeros,
        scatter,  # the sums' gradient, scattered back to the nodes (index_add)
        gather,  # and gathered to the edges (the scatter_add's backward)
        per_edge,  # the two gradients of exp's result added
        per_edge,  # exp's: times its result
        per_edge,  # leaky_relu_backward
    )
    alpha_collect_bw = _sum(zeros, scatter, zeros, scatter)  # index_add back, both sides
    # alpha_src's and alpha_dst's backward: the gradient (broadcast over the channels) times
    # x' (att's), times att (x''s), att's summed over the nodes, x''s added to the other one
    alpha_bw = _sum(
        (n * hc, n * heads * F4 + n * hc * F4, n * hc * F4),
        (n * hc, n * heads * F4 + hc * F4, n * hc * F4),
        (n * hc, n * hc * F4, hc * F4),
        (n * hc, 2 * n * hc * F4, n * hc * F4),
    )
    own_bw = _sum((n * hc, n * hc * F4, hc * F4), alpha_bw, alpha_bw)  # the bias's sum first
    lin_bw = _sum(_mm(hc, n, fin), _mm(n, hc, fin))
    updater, updater_bw = _sum(alpha_collect, edge_update), _sum(edge_update_bw, alpha_collect_bw)
    propagate = _sum(collect, message, aggregate)
    propagate_bw = _sum(aggregate_bw, message_bw, collect_bw)
    _assert_rows(
        rows,
        {
            ("GATConv", "forward"): _sum(lin, own, remove, add_loops, updater, propagate),
            ("GATConv/lin", "forward"): lin,
            ("GATConv/remove_self_loops", "forward"): remove,
            ("GATConv/add_self_loops", "forward"): add_loops,
            ("GATConv/edge_updater", "forward"): updater,
            ("GATConv/edge_updater/collect", "forward"): alpha_collect,
            ("GATConv/edge_updater/edge_update", "forward"): edge_update,
            ("GATConv/propagate", "forward"): propagate,
            ("GATConv/propagate/collect", "forward"): collect,
            ("GATConv/propagate/message", "forward"): message,
            ("GATConv/propagate/aggregate", "forward"): aggregate,
            ("GATConv", "backward"): _sum(own_bw, propagate_bw, updater_bw, lin_bw),
            ("GATConv/propagate", "backward"): propagate_bw,
            ("GATConv/propagate/aggregate", "backward"): aggregate_bw,
            ("GATConv/propagate/message", "backward"): message_bw,
            ("GATConv/propagate/collect", "backward"): collect_bw,
            ("GATConv/edge_updater", "backward"): updater_bw,
            ("GATConv/edge_updater/edge_update", "backward"): edge_update_bw,
            ("GATConv/edge_updater/collect", "backward"): alpha_collect_bw,
            ("GATConv/lin", "backward"): lin_bw,
        },
    )


def test_dgl_graphconv_forward_and_backward_hand_computed():
    dgl = pytest.importorskip("dgl")
    from instrumented_convs.dgl import GraphConv

    ei = _graph()
    g = dgl.add_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=N))  # int64 indices
    n, fin, h, E = N, FIN, H, EDGES + N
    rows = _run_layer(GraphConv(fin, h), g, torch.randn(n, fin, requires_grad=True))
    # DGL computes degrees in its C library (not counted: the counters see what torch runs);
    # around it: arange(n) (the nodes asked for), == 0, any()
    check = _sum((0, 0, n * I8), (n, n * I8, n * B1), (n, n * B1, B1))
    to_float = _sum((0, n * I8, n * F4), (n, n * F4, n * F4))  # .float(), clamp(min=1)
    # out_degrees(nodes) first checks its nodes: their min, and how many are valid (summed)
    out_degrees = _sum(
        (0, 0, n * I8), (n, n * I8, 2 * I8), (0, n * I8, n * B1), (n, n * B1, I8), to_float
    )
    in_degrees = _sum((0, 0, n * I8), to_float)
    power = (n, n * F4, n * F4)  # ** -0.5
    norm_src_mul = (n * fin, n * fin * F4 + n * F4, n * fin * F4)  # x * the norm (broadcast)
    norm_src = _sum(out_degrees, power, norm_src_mul)
    matmul = _mm(n, fin, h)  # fin > h: the transform first
    # zeros(n, h), then gspmm (copy_u, sum): an add per edge and channel; the graph's two
    # indices per edge and the source rows read once, the result written
    update = _sum((0, 0, n * h * F4), (E * h, 2 * E * I8 + n * h * F4, n * h * F4))
    norm_dst_mul = (n * h, n * h * F4 + n * F4, n * h * F4)
    norm_dst = _sum(in_degrees, power, norm_dst_mul)
    bias = (n * h, n * h * F4 + h * F4, n * h * F4)
    bias_bw = (n * h, n * h * F4, h * F4)
    matmul_bw = _sum(_mm(fin, n, h), _mm(n, h, fin))  # the weight's gradient, the input's
    backward = _sum(bias_bw, norm_dst_mul, update, matmul_bw, norm_src_mul)
    _assert_rows(
        rows,
        {
            ("GraphConv", "forward"): _sum(check, norm_src, matmul, update, norm_dst, bias),
            ("GraphConv/zero_in_degree_check", "forward"): check,
            ("GraphConv/norm_src", "forward"): norm_src,
            ("GraphConv/norm_src/degrees", "forward"): out_degrees,
            ("GraphConv/norm_src/pow", "forward"): power,
            ("GraphConv/norm_src/mul", "forward"): norm_src_mul,
            ("GraphConv/matmul", "forward"): matmul,
            ("GraphConv/update_all", "forward"): update,  # DGL's kernel, counted by its formula
            ("GraphConv/norm_dst", "forward"): norm_dst,
            ("GraphConv/norm_dst/degrees", "forward"): in_degrees,
            ("GraphConv/norm_dst/pow", "forward"): power,
            ("GraphConv/norm_dst/mul", "forward"): norm_dst_mul,
            ("GraphConv/bias", "forward"): bias,
            ("GraphConv", "backward"): backward,
            ("GraphConv/bias", "backward"): bias_bw,
            ("GraphConv/norm_dst", "backward"): norm_dst_mul,  # the gradient times the norm
            ("GraphConv/norm_dst/mul", "backward"): norm_dst_mul,
            ("GraphConv/update_all", "backward"): update,  # the same kernel, reversed graph
            ("GraphConv/matmul", "backward"): matmul_bw,
            ("GraphConv/norm_src", "backward"): norm_src_mul,
            ("GraphConv/norm_src/mul", "backward"): norm_src_mul,
        },
    )


@pytest.mark.sparse
def test_gcnconv_sparsetensor_forward_and_backward_hand_computed():
    pytest.importorskip("torch_geometric")
    from torch_sparse import SparseTensor

    from instrumented_convs.pyg import GCNConv

    ei = _graph()
    adj = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(N, N))  # no values, no rowptr yet
    n, e, fin, h, E = N, EDGES, FIN, H, EDGES + N
    rows = _run_layer(GCNConv(fin, h), torch.randn(n, fin, requires_grad=True), adj)
    fill_value = (0, 0, e * F4)  # full(e, 1.0): the values

    def validate(nnz):  # a new storage checks its indices: row.max(), col.max()
        return _sum((nnz, nnz * I8, I8), (nnz, nnz * I8, I8))

    remove_diag = _sum(
        (e, 2 * e * I8, e * B1),  # row != col
        (0, e * I8 + e * B1, e * I8),  # row[mask]: all e kept
        (0, e * I8 + e * B1, e * I8),  # col[mask]
        (0, e * F4 + e * B1, e * F4),  # value[mask]
        validate(e),  # the new storage's checks
    )
    set_diag = _sum(
        (0, 2 * e * I8, E * B1),  # torch_sparse.non_diag_mask(row, col, ...)
        (E, E * B1, E * B1),  # ~mask
        (0, 0, n * I8),  # arange(n): the diagonal
        (0, E * B1 + e * I8, E * I8),  # new_row[mask] = row
        (0, E * B1 + n * I8, E * I8),  # new_row[~mask] = diagonal
        (0, E * B1 + e * I8, E * I8),  # new_col[mask] = col
        (n, n * I8, n * I8),  # diagonal.add_(k)
        (0, E * B1 + n * I8, E * I8),  # new_col[~mask] = diagonal
        (0, E * B1 + e * F4, E * F4),  # new_value[mask] = value
        (0, E * B1 + n * F4, E * F4),  # new_value[~mask] = the fill values
        validate(E),
    )
    fill_diag = _sum((0, 0, n * F4), remove_diag, set_diag)  # new_full(n, 1.0) first
    degree = _sum(
        (0, E * I8, (n + 1) * I8),  # torch_sparse.ind2ptr: rowptr from the rows
        (E, E * F4 + (n + 1) * I8, n * F4),  # torch_scatter.segment_sum_csr of the values
    )
    normalize = _sum(
        (n, n * F4, n * F4),  # pow_(-0.5)
        (n, n * F4, n * B1),  # == inf
        (n, n * F4 + n * B1, n * F4),  # masked_fill_
        (0, E * F4 + (n + 1) * I8, E * F4),  # torch_scatter.gather_csr: a row's norm per value
        (E, 2 * E * F4, E * F4),  # times the values (in place)
        (0, E * F4 + E * I8, E * F4),  # the norm of each value's column: deg_inv_sqrt[col]
        (E, 2 * E * F4, E * F4),  # times
    )
    norm = _sum(fill_value, fill_diag, degree, normalize)
    lin, bias = _mm(n, fin, h), (n * h, n * h * F4 + h * F4, n * h * F4)
    csr = (n + 1) * I8 + E * I8 + E * F4  # torch's CSR of the normalised adjacency
    # torch.sparse.mm(csr, x, "sum"): a multiply and an add per stored value and channel
    spmm = (2 * E * h, csr + n * h * F4, n * h * F4)
    # its backward, x's gradient only (csr^T @ grad): the same product; x itself not read
    spmm_bw = (2 * E * h, csr + n * h * F4, n * h * F4)
    lin_bw = _sum(_mm(h, n, fin), _mm(n, h, fin))
    bias_bw = (n * h, n * h * F4, h * F4)
    _assert_rows(
        rows,
        {
            ("GCNConv", "forward"): _sum(norm, lin, spmm, bias),
            ("GCNConv/gcn_norm", "forward"): norm,
            ("GCNConv/gcn_norm/fill_value", "forward"): fill_value,
            ("GCNConv/gcn_norm/fill_diag", "forward"): fill_diag,
            ("GCNConv/gcn_norm/degree", "forward"): degree,
            ("GCNConv/gcn_norm/normalize", "forward"): normalize,
            ("GCNConv/lin", "forward"): lin,
            ("GCNConv/propagate", "forward"): spmm,
            ("GCNConv/propagate/message_and_aggregate", "forward"): spmm,
            ("GCNConv/bias", "forward"): bias,
            ("GCNConv", "backward"): _sum(bias_bw, spmm_bw, lin_bw),
            ("GCNConv/bias", "backward"): bias_bw,
            ("GCNConv/propagate", "backward"): spmm_bw,
            ("GCNConv/propagate/message_and_aggregate", "backward"): spmm_bw,
            ("GCNConv/lin", "backward"): lin_bw,
        },
    )
    assert not any(r.unknown for r in registry.summary())


def test_the_roofline_plot_puts_each_step_at_its_intensity_and_rate(tmp_path):
    pytest.importorskip("matplotlib")
    from instrumented_convs.roofline import plot

    ms = 1_000_000
    stats = [
        EntryStats(
            "L", "L", None, "step", 0, -1, 1, 7 * ms, 49 * ms * ms, 7 * ms, 7 * ms, 0, 0, ops=1
        ),
        EntryStats(
            "lin",
            "L/lin",
            None,
            "step",
            1,
            0,
            1,
            2 * ms,
            4 * ms * ms,
            2 * ms,
            2 * ms,
            0,
            0,
            flops=4_000_000,
            bytes_read=1_000_000,
            bytes_written=1_000_000,
            ops=1,
        ),
        EntryStats(
            "agg",
            "L/agg",
            None,
            "step",
            1,
            0,
            1,
            4 * ms,
            16 * ms * ms,
            4 * ms,
            4 * ms,
            0,
            0,
            flops=1_000,
            bytes_read=30_000_000,
            bytes_written=10_000_000,
            ops=1,
        ),
        EntryStats(
            "collect",
            "L/collect",
            None,
            "step",
            1,
            0,
            1,
            ms,
            ms * ms,
            ms,
            ms,
            0,
            0,
            bytes_read=8,
            bytes_written=8,
            ops=1,
        ),
        EntryStats(
            "lin",
            "L/lin",
            None,
            "step",
            1,
            0,
            1,
            4 * ms,
            16 * ms * ms,
            4 * ms,
            4 * ms,
            0,
            0,
            phase="backward",
            flops=8_000_000,
            bytes_read=4_000_000,
            ops=1,
        ),
    ]
    path = tmp_path / "roof.png"
    ax = plot(summarize(stats), (10.0, 20.0), str(path), label="run")
    assert path.stat().st_size > 0
    points = {line.get_label(): list(zip(*line.get_data())) for line in ax.lines[:2]}
    # lin: 4 MFLOP over 2 MB in 2 ms: 2 FLOP/B at 2 GFLOP/s; agg: 1 kFLOP over 40 MB in 4 ms;
    # lin's backward: 8 MFLOP over 4 MB in 4 ms. collect did no FLOPs: left out, listed.
    assert points == {
        "run, forward": [(2.0, 2.0), (1_000 / 40_000_000, 1_000 / 4e-3 / 1e9)],
        "run, backward": [(2.0, 2.0)],
    }
    assert ax.ic_left_out == ["L/collect"]
    roof = ax.lines[2].get_data()  # from the slope (10 GB/s) to the ceiling at the ridge, 2
    assert list(roof[1])[1:] == [20.0, 20.0] and list(roof[0])[1] == 2.0


def _outputs_and_grads(conv, x, graph):
    x = x.clone().requires_grad_()
    out = conv(x, graph)
    out.backward(torch.ones_like(out))
    grads = [x.grad] + [p.grad.clone() for p in conv.parameters()]
    conv.zero_grad()
    return [out.detach()] + grads


@pytest.mark.parametrize("layer", ["GCNConv", "GATConv", "SAGEConv"])
def test_counting_changes_no_output_and_no_gradient(layer):
    pytest.importorskip("torch_geometric")
    from instrumented_convs import pyg

    torch.manual_seed(0)
    conv, x, ei = getattr(pyg, layer)(FIN, H), torch.randn(N, FIN), _graph()
    plain = _outputs_and_grads(conv, x, ei)
    with configure(counters=True):
        counted_run = _outputs_and_grads(conv, x, ei)
    assert all(torch.equal(a, b) for a, b in zip(plain, counted_run))


@pytest.mark.sparse
def test_counting_a_sparsetensor_layer_changes_nothing_either():
    pytest.importorskip("torch_geometric")
    from torch_sparse import SparseTensor

    from instrumented_convs.pyg import GCNConv

    torch.manual_seed(0)
    ei = _graph()
    conv, x = GCNConv(FIN, H), torch.randn(N, FIN)
    plain = _outputs_and_grads(conv, x, SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(N, N)))
    with configure(counters=True):
        adj = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(N, N))
        counted_run = _outputs_and_grads(conv, x, adj)
    assert all(torch.equal(a, b) for a, b in zip(plain, counted_run))
