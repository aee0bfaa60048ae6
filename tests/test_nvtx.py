"""NVTX ranges captured for real: an injection library records every push and pop."""

from __future__ import annotations

import textwrap

import pytest

from . import nvtx_capture as nc

pytestmark = pytest.mark.nvtx


@pytest.fixture(scope="module")
def injection(tmp_path_factory):
    if nc.compiler() is None:
        pytest.skip("no C compiler (gcc/cc/clang) to build the NVTX injection library")
    if nc.nvtx_include_dir() is None:
        pytest.skip("NVTX headers missing: pip install nvidia-nvtx-cu12")
    pytest.importorskip("nvtx")
    return nc.build_injection(tmp_path_factory.mktemp("inject"))


def _run(injection, tmp_path, body, env=None):
    code = (
        "import instrumented_convs as ic\nfrom instrumented_convs import region\nfrom "
        "instrumented_convs.layers import step\n" + textwrap.dedent(body)
    )
    proc, events = nc.capture(injection, code, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    return proc, events


def test_ranges_names_nesting_and_balance(injection, tmp_path):
    _, events = _run(
        injection,
        tmp_path,
        """
        assert ic.configure().nvtx == "nvtx"
        with region("forward"):
            with step("GCNConv"):
                with step("gcn_norm"):
                    with step("add_remaining_self_loops"):
                        pass
                with step("lin"):
                    pass
        with region("backward"):
            pass
    """,
    )
    assert nc.ranges(events) == [
        (1, "forward"),
        (2, "GCNConv"),
        (3, "gcn_norm"),
        (4, "add_remaining_self_loops"),
        (3, "lin"),
        (1, "backward"),
    ]
    assert nc.balanced(events)
    assert all(e.domain == "instrumented_convs" for e in events)


def test_ranges_stay_balanced_when_a_step_raises(injection, tmp_path):
    _, events = _run(
        injection,
        tmp_path,
        """
        for i in range(3):
            try:
                with step("outer"):
                    with step("inner"):
                        raise RuntimeError("bad input")
            except RuntimeError:
                pass
        with step("after"):
            pass
    """,
    )
    assert nc.ranges(events) == [(1, "outer"), (2, "inner")] * 3 + [(1, "after")]
    assert nc.balanced(events)
    pops = [e for e in events if e.kind == "pop"]
    assert len(pops) == 7


def test_ranges_from_threads_are_balanced_per_thread(injection, tmp_path):
    _, events = _run(
        injection,
        tmp_path,
        """
        import threading
        def work():
            for _ in range(50):
                with step("outer"):
                    with step("inner"):
                        pass
        ts = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
    """,
    )
    assert nc.balanced(events)
    tids = {e.tid for e in events}
    assert len(tids) == 4
    assert sorted(set(nc.ranges(events))) == [(1, "outer"), (2, "inner")]
    assert len(nc.ranges(events)) == 400


def test_nvtx_switch_and_disable_open_no_ranges(injection, tmp_path):
    _, events = _run(
        injection,
        tmp_path,
        """
        ic.configure(nvtx=False)
        with step("timed_only"):
            pass
        ic.configure(nvtx=True)
        with ic.configure(enabled=False):
            with step("off"):
                pass
        with step("on"):
            pass
        assert ic.registry.summary()["timed_only"].count == 1
    """,
    )
    assert nc.ranges(events) == [(1, "on")]


def test_env_var_switches_nvtx_off(injection, tmp_path):
    _, events = _run(
        injection,
        tmp_path,
        """
        with step("x"):
            pass
        assert ic.registry.summary()["x"].count == 1
    """,
        env={"INSTRUMENTED_CONVS_NVTX": "0"},
    )
    assert nc.ranges(events) == []


def test_a_range_that_fails_to_open_its_profiler_label_is_closed(injection, tmp_path):
    # If record_function fails after the NVTX push, the push must be undone.
    _, events = _run(
        injection,
        tmp_path,
        """
        import torch
        from instrumented_convs.core.labels import profiler
        def broken(name):
            raise RuntimeError("profiler failure")
        profiler.open_record_function = broken
        class Recording:
            _is_profiler_enabled = True
        profiler.profiler_state = Recording()
        try:
            with step("x"):
                pass
        except RuntimeError:
            pass
        else:
            raise SystemExit("expected the failure to propagate")
        from instrumented_convs.testing import depth
        assert depth() == 0
    """,
    )
    assert nc.ranges(events) == [(1, "x")]
    assert nc.balanced(events)


def test_backend_can_be_switched_off_and_back(injection, tmp_path):
    _, events = _run(
        injection,
        tmp_path,
        """
        assert ic.configure(nvtx="none").nvtx == "nvtx"   # what it replaced: auto, a tool attached
        assert ic.configure().nvtx == "none"
        with step("silent"):
            pass
        assert ic.configure(nvtx="auto").nvtx == "none"
        assert ic.configure().nvtx == "nvtx"
        with step("loud"):
            pass
        with ic.configure(nvtx=False):
            with step("quiet"):
                pass
        assert ic.configure().nvtx == "nvtx"
        try:
            ic.configure(nvtx="bogus")
        except ValueError:
            pass
        else:
            raise SystemExit("expected ValueError")
        assert ic.registry.summary()["silent"].count == 1
    """,
    )
    assert nc.ranges(events) == [(1, "loud")]


@pytest.mark.parametrize("with_sparse", [False, pytest.param(True, marks=pytest.mark.sparse)])
def test_pyg_gcnconv_ranges_are_real_and_balanced(injection, tmp_path, with_sparse):
    pytest.importorskip("torch_geometric")
    _, events = _run(
        injection,
        tmp_path,
        f"""
        import torch
        from instrumented_convs.pyg import GCNConv
        conv = GCNConv(4, 3)
        x = torch.randn(6, 4)
        ei = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
        conv(x, ei)
        if {with_sparse}:
            from torch_sparse import SparseTensor
            conv(x, SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(6, 6)))
        try:
            conv(torch.randn(6, 5), ei)  # wrong feature size
        except RuntimeError:
            pass
        else:
            raise SystemExit("expected a RuntimeError")
    """,
    )
    names = nc.ranges(events)
    edge_index_forward = [
        (1, "GCNConv"),
        (2, "gcn_norm"),
        (3, "add_remaining_self_loops"),
        (3, "degree"),
        (3, "normalize"),
        (2, "lin"),
        (2, "propagate"),
        (3, "collect"),
        (3, "message"),
        (3, "aggregate"),
        (2, "bias"),
    ]
    assert names[:11] == edge_index_forward
    sparse_forward = [
        (1, "GCNConv"),
        (2, "gcn_norm"),
        (3, "fill_value"),
        (3, "fill_diag"),
        (3, "degree"),
        (3, "normalize"),
        (2, "lin"),
        (2, "propagate"),
        (3, "message_and_aggregate"),
        (2, "bias"),
    ]
    if with_sparse:
        assert names[11:21] == sparse_forward
    # the failing call opened its ranges up to lin, where the matmul raised, and closed them
    assert names[21 if with_sparse else 11 :] == edge_index_forward[:6]
    assert nc.balanced(events)


def test_dgl_graphconv_ranges_are_real_and_balanced(injection, tmp_path):
    pytest.importorskip("dgl")
    _, events = _run(
        injection,
        tmp_path,
        """
        import os
        os.environ.setdefault("DGLBACKEND", "pytorch")
        import dgl, torch
        from dgl.base import DGLError
        from instrumented_convs.dgl import GraphConv
        g = dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])), num_nodes=4)
        GraphConv(5, 3, activation=torch.relu)(g, torch.randn(4, 5))
        try:
            GraphConv(5, 3)(dgl.graph((torch.tensor([0]), torch.tensor([1])), num_nodes=4), \
torch.randn(4, 5))
        except DGLError:
            pass
        else:
            raise SystemExit("expected the zero-in-degree DGLError")
    """,
        env={"DGLBACKEND": "pytorch"},
    )
    names = nc.ranges(events)
    assert names[:14] == [
        (1, "GraphConv"),
        (2, "local_scope"),
        (2, "zero_in_degree_check"),
        (2, "norm_src"),
        (3, "degrees"),
        (3, "pow"),
        (3, "mul"),
        (2, "matmul"),
        (2, "update_all"),
        (2, "norm_dst"),
        (3, "degrees"),
        (3, "pow"),
        (3, "mul"),
        (2, "bias"),
    ]
    assert names[14:16] == [(2, "activation"), (2, "local_scope_exit")]
    # the second call raises in its check; leaving the scope is still a step, balanced
    assert names[16:] == [
        (1, "GraphConv"),
        (2, "local_scope"),
        (2, "zero_in_degree_check"),
        (2, "local_scope_exit"),
    ]
    assert nc.balanced(events)


def test_ranges_reach_a_tool_that_reports_domains_disabled(injection, tmp_path):
    """nvtx >= 0.2.12 swaps in a no-op DummyDomain when nvtxDomainIsEnabled says 0, as it
    does under Nsight Systems 2022.4; with a tool attached we must build the real domain."""
    nvtx = pytest.importorskip("nvtx")
    lib = pytest.importorskip("nvtx._lib.lib")
    if not hasattr(lib, "dummy_domain"):
        pytest.skip(f"nvtx {getattr(nvtx, '__version__', '<= 0.2.11')} has no DummyDomain")
    _, events = _run(
        injection,
        tmp_path,
        """
        import nvtx
        from nvtx._lib import lib
        real_get_domain = nvtx.get_domain
        nvtx.get_domain = lambda name=None: lib.dummy_domain   # what nsys 2022.4 leads to
        from instrumented_convs.core.labels import nvtx as labels
        ic.configure(nvtx="nvtx")
        assert ic.configure().nvtx == "nvtx" and labels.backend.forced
        with step("outer"):
            with step("inner"):
                pass
    """,
    )
    assert nc.ranges(events) == [(1, "outer"), (2, "inner")]
    assert nc.balanced(events)


def test_backward_ranges_are_real_nested_and_balanced(injection, tmp_path):
    """Each step's backward is an NVTX range "<step> [backward]", nested like its forward,
    inside the region the user put around ``backward()`` (CPU: autograd runs there)."""
    pytest.importorskip("torch_geometric")
    _, events = _run(
        injection,
        tmp_path,
        """
        import torch
        from instrumented_convs.pyg import GCNConv
        conv = GCNConv(4, 3)
        x = torch.randn(6, 4)
        ei = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
        with region("forward"):
            out = conv(x, ei)
        with region("backward"):
            out.sum().backward()
    """,
    )
    names = nc.ranges(events)
    start = names.index((1, "backward"))
    assert names[start:] == [
        (1, "backward"),
        (2, "GCNConv [backward]"),
        (3, "bias [backward]"),
        (3, "propagate [backward]"),
        (4, "aggregate [backward]"),
        (4, "message [backward]"),
        (4, "collect [backward]"),
        (3, "lin [backward]"),
    ]
    assert nc.balanced(events)


def test_backward_ranges_stay_balanced_when_backward_raises(injection, tmp_path):
    """A backward that raises inside a step's backward leaves no range open: the enclosing
    region closes them, or (without one) the next step on that thread does."""
    _, events = _run(
        injection,
        tmp_path,
        """
        import torch

        class Boom(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                raise RuntimeError("boom")

        @step("block")
        def block(x, w):
            return (Boom.apply(x) * w).sum()

        w = torch.ones(3, requires_grad=True)
        for use_region in (True, False):
            loss = block(torch.ones(3, requires_grad=True), w)
            try:
                if use_region:
                    with region("backward"):
                        loss.backward()
                else:
                    loss.backward()
            except RuntimeError as exc:
                assert "boom" in str(exc)
            else:
                raise SystemExit("expected the backward to raise")
            del loss
        with step("after"):
            pass
    """,
    )
    names = nc.ranges(events)
    assert names.count((1, "block")) == 2
    assert (2, "block [backward]") in names and (1, "block [backward]") in names
    assert names[-1] == (1, "after")
    assert nc.balanced(events)


def test_generic_layers_ranges_are_real_and_balanced(injection, tmp_path):
    """Generic layers (hooks and wrappers) push the same ranges as their steps, balanced
    also when a child module raises (PyG) and for DGL's kernels."""
    pytest.importorskip("torch_geometric")
    pytest.importorskip("dgl")
    _, events = _run(
        injection,
        tmp_path,
        """
        import os
        os.environ["DGLBACKEND"] = "pytorch"
        import torch, dgl
        from instrumented_convs.pyg import SAGEConv
        from instrumented_convs.dgl import GATConv
        ei = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
        conv = SAGEConv(4, 3)
        conv(torch.randn(6, 4), ei)
        try:
            conv(torch.randn(6, 5), ei)  # lin_l raises inside its step
        except RuntimeError:
            pass
        else:
            raise SystemExit("expected a RuntimeError")
        g = dgl.add_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=6))
        GATConv(4, 2, 1)(g, torch.randn(6, 4))
    """,
    )
    names = nc.ranges(events)
    sage = [
        (1, "SAGEConv"),
        (2, "propagate"),
        (3, "collect"),
        (3, "message"),
        (3, "aggregate"),
        (3, "update"),
        (2, "lin_l"),
        (2, "lin_r"),
        (2, "out = out + self.lin_r(x_r)"),  # the addition, after lin_r's own step
    ]
    setup = (1, "instrumented_convs (setup)")  # the class's statements made into steps
    assert names[0] == setup
    names = names[1:]
    assert names[:9] == sage
    assert names[9:16] == sage[:7]  # the second call, up to lin_l, which raised
    gat = [n for n in names[names.index((1, "GATConv")) :] if n != setup]
    for expected in [
        (2, "local_scope"),
        (2, "fc"),
        (2, "apply_edges"),
        (3, "gsddmm"),
        (2, "edge_softmax"),
        (2, "update_all"),
        (3, "gspmm"),
        (2, "local_scope_exit"),
    ]:
        assert expected in gat, (expected, gat)
    assert nc.balanced(events)


def test_no_tool_attached_means_no_nvtx_calls_until_forced():
    """Without NVTX_INJECTION64_PATH no tool can ever receive a range, so the default backend
    pushes none (each push would be a Python call into a C no-op); forcing one still works."""
    pytest.importorskip("nvtx")
    import os
    import subprocess
    import sys

    from .helpers import ROOT, python_path

    code = textwrap.dedent("""
        import instrumented_convs as ic
        from instrumented_convs.layers import step
        assert ic.configure().nvtx == "none", ic.configure().nvtx
        with step("x"):
            pass
        ic.configure(nvtx="nvtx")
        assert ic.configure().nvtx == "nvtx"
        with step("y"):
            pass
        assert ic.registry.summary()["y"].count == 1
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTX_INJECTION")}
    env["PYTHONPATH"] = python_path()
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
