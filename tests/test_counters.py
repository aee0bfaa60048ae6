"""The counters: FLOPs and bytes per step, exact on CPU, and the roofline table."""

from __future__ import annotations

import pytest
import torch

from instrumented_convs import configure, region, registry
from instrumented_convs._entry import EntryStats
from instrumented_convs._roof import Peak
from instrumented_convs._stats import summarize
from instrumented_convs.layers import mark_outputs, step
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
    assert s["step"].flops >= s["step/layer"].flops  # the region holds both


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
        EntryStats("lin", "lin", None, "step", 0, -1, 2, 2_000_000, 2_000_000_000_000,
                   1_000_000, 1_000_000, 0, 0, flops=4_000_000, bytes_read=1_000_000,
                   bytes_written=1_000_000, ops=2),
        EntryStats("agg", "agg", None, "step", 0, -1, 1, 4_000_000, 16_000_000_000_000,
                   4_000_000, 4_000_000, 0, 0, flops=1_000, bytes_read=30_000_000,
                   bytes_written=10_000_000, ops=3, unknown="aten.foo:2"),
    ]  # fmt: skip
    text = summarize(stats, unit="ms").table(counters=True, peak=Peak(10.0, 1.0, "fixed"))
    lines = text.splitlines()
    assert [c.strip() for c in lines[1].split("|")[1:]] == [
        "Count", "Time/call", "FLOP", "Bytes", "FLOP/B", "GFLOP/s", "GB/s", "Bound",
        "Roof/call", "x roof",
    ]  # fmt: skip
    # lin: 4 MFLOP in 2 ms: 2 GFLOP/s; 2 MB: 1 GB/s; roof: 4e6 / 1e9 = 4 ms > 2e6 / 1e10
    assert [c.strip() for c in lines[2].split("|")[1:]] == [
        "2", "1.000", "4M", "2M", "2", "2", "1", "compute", "2.000", "0.5",
    ]  # fmt: skip
    # agg: 40 MB in 4 ms: 10 GB/s, at the memory roof (4 ms): x roof 1
    assert [c.strip() for c in lines[3].split("|")[1:]] == [
        "1", "4.000", "1k", "40M", "2.5e-05", "0.00025", "10", "memory", "4.000", "1",
    ]  # fmt: skip
    assert "10.0 GB/s, 1.0 GFLOP/s: fixed" in text
    assert "agg: no formula for aten.foo x2" in text


def test_counters_survive_saving_and_merging_ranks():
    from instrumented_convs._stats import merge_ranks
    from instrumented_convs.report import Summary

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
    proc = run_script("-m", "instrumented_convs", "run", "--counters", "-o", "out", script,
                      "--epochs", "1", cwd=tmp_path, env=env)  # fmt: skip
    assert "x roof" in proc.stdout and "Roof: the time at the machine's limit" in proc.stdout
    run = __import__("json").loads((tmp_path / "out" / "run.json").read_text())
    assert run["peak"]["gbs"] > 0 and run["peak"]["gflops"] > 0
    assert run["settings"]["counters"] is True and run["settings"]["backward_every"] == 1
    view = run_script("-m", "instrumented_convs", "view", "out", "--counters", cwd=tmp_path)
    lines = {line.split("|")[0].strip() for line in view.stdout.splitlines() if "|" in line}
    assert {"- forward", "- GCNConv", "- lin", "- aggregate"} <= lines
    assert "no formula" not in view.stdout  # every op of this script has a formula


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
    e, h = g.num_edges(), 3
    update = s["step/GraphConv/update_all"]
    assert update.flops == e * h and update.bytes_read == 2 * e * 8 + 20 * h * 4
    # the result written once (and zero-filled first where DGL allocates it with zeros)
    assert update.bytes_written in (20 * h * 4, 2 * 20 * h * 4)
    assert not forward.unknown and backward.flops > 0  # its backward: the same kernels
    with configure(counters=True):
        with step("softmax"):
            dgl.ops.edge_softmax(g, torch.randn(g.num_edges(), 1))
    assert "dgl.edge_softmax:1" in registry.summary()["softmax"].unknown  # no formula: listed


def test_times_from_a_run_without_counters_with_the_flops_per_call():
    counted_stats = [
        EntryStats("agg", "agg", None, "step", 0, -1, 2, 8_000_000, 32_000_000_000_000,
                   4_000_000, 4_000_000, 0, 0, flops=2_000, bytes_read=30_000_000,
                   bytes_written=10_000_000, ops=6),
    ]  # fmt: skip
    timed_stats = [  # 4 calls of 1 ms each, without the counters' overhead
        EntryStats("agg", "agg", None, "step", 0, -1, 4, 4_000_000, 4_000_000_000_000,
                   1_000_000, 1_000_000, 0, 0),
    ]  # fmt: skip
    counted, timed = summarize(counted_stats, unit="ms"), summarize(timed_stats, unit="ms")
    text = counted.table(counters=True, peak=Peak(40.0, 1.0, "fixed"), times=timed)
    row = [c.strip() for c in text.splitlines()[2].split("|")[1:]]
    # 20 MB a call over 4 calls: 80 MB in 4 ms = 20 GB/s, half the 40 GB/s roof: x roof 2
    assert row == ["4", "1.000", "4k", "80M", "5e-05", "0.001", "20", "memory", "0.500", "2"]
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
    assert read == (7 + nnz) * I8 + nnz * F4 + 5 * 4 * F4  # crow, col, values; the dense rows
    assert counted("spmm", "backward")[0] >= 2 * nnz * 4  # at least one gradient's product
    assert not registry.summary()["spmm"].unknown
