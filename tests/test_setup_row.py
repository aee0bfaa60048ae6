"""The tool's one-time work at a first call kept out of the user's rows (issue 63): run's
instrumenting of a model at its first call, a layer class's statements made into steps at its
first call. The steps and regions around it leave it out, a loader's pass leaves it out, and
it is one row of the tool's own, outside the total. A clock that moves by a fixed amount at
every reading stands for the tool's cost, ``advance`` for the work."""

from __future__ import annotations

import pytest
import torch

from instrumented_convs import configure, region, registry
from instrumented_convs.core.frames import setup as setup_frames
from instrumented_convs.core.frames.setup import SETUP, setup, tool_time
from instrumented_convs.layers import step
from instrumented_convs.testing import cpu_clock, depth

from .helpers import READ, Ticking

WORK, TOOL = 100_000, 1_000_000_000  # the user's work; the tool's one-time work (1 s)


@pytest.fixture(params=["none", True], ids=["fast path", "general path"])
def path(request):
    """No NVTX backend (the fast path), or one (every step takes the general path)."""
    configure(nvtx=request.param)


def _rows(**kw):
    return {r.name: r for r in registry.summary(**kw).rows}


def test_a_step_and_the_regions_around_it_leave_the_tools_work_out(path):
    with cpu_clock(Ticking()) as clock:
        with region("epoch"):
            with region("forward"):
                with step("layer"):
                    with setup():
                        clock.advance(TOOL)
                        with setup():  # nested: the outermost counts
                            clock.advance(TOOL)
                    clock.advance(WORK)
            clock.advance(WORK)
    summary = registry.summary()
    rows = {r.name: r for r in summary.rows}
    for name in ("epoch", "epoch/forward", "epoch/forward/layer"):
        assert rows[name].total * 1e9 < 2 * WORK + 20 * READ, name
    tool = rows[SETUP]
    assert tool.kind == "tool" and tool.count == 1
    assert 2 * TOOL <= tool.total * 1e9 <= 2 * TOOL + 4 * READ
    assert summary.rows[-1] is tool  # last, and outside the total: the fractions add up
    assert summary.total == pytest.approx(rows["epoch"].total)
    assert rows["epoch"].fraction == pytest.approx(1.0)
    text = summary.table()
    assert f"- {SETUP}" in text and "the tool's one-time work" in text
    assert depth() == 0 and not setup_frames._debts


def test_a_region_discarded_after_the_tools_work_leaves_nothing_behind(path):
    from instrumented_convs.core.steps.step import Step

    data = Step("data", None, "cpu", "region")
    with cpu_clock(Ticking()) as clock:
        data.__enter__()
        with setup():
            clock.advance(TOOL)
        data.discard()  # (an iterator's end: not a batch)
        assert not setup_frames._debts and depth() == 0
        with data:  # the frame reused: none of the work left to take off
            clock.advance(WORK)
    rows = _rows()
    assert WORK <= rows["data"].total * 1e9 <= WORK + 4 * READ


def test_a_layer_class_made_with_steps_at_its_first_call_is_the_tools_work(monkeypatch):
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GCNConv as Stock

    from instrumented_convs.layers.statements import forward as statements
    from instrumented_convs.pyg import GCNConv

    own = statements.Own(Stock, frozenset(), frozenset())  # a class not made yet
    real = statements.with_steps
    clock = Ticking()

    def slow(*args, **kwargs):
        clock.advance(TOOL)
        return real(*args, **kwargs)

    monkeypatch.setattr(statements, "with_steps", slow)
    layer = GCNConv(4, 4)
    x, edge_index = torch.randn(5, 4), torch.tensor([[0, 1, 2], [1, 2, 3]])
    with cpu_clock(clock):
        with region("forward (no grad)"), torch.no_grad():
            with step("outer"):
                assert own.resolve() is not None
                layer(x, edge_index)
    rows = _rows()
    assert rows["forward (no grad)"].total * 1e9 < TOOL
    assert rows["forward (no grad)/outer"].total * 1e9 < TOOL
    assert rows[SETUP].total * 1e9 >= TOOL


def test_runs_instrumenting_at_a_first_call_is_the_tools_work(monkeypatch):
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GCNConv

    from instrumented_convs.commands.launch import hooks as hooks_module

    clock = Ticking()
    real = hooks_module.instrument

    def slow(*args, **kwargs):
        clock.advance(TOOL)
        return real(*args, **kwargs)

    monkeypatch.setattr(hooks_module, "instrument", slow)
    model = torch.nn.Sequential()
    model.add_module("conv", GCNConv(4, 4))
    x, edge_index = torch.randn(5, 4), torch.tensor([[0, 1, 2], [1, 2, 3]])
    h = hooks_module.Hooks(data=False).install()
    try:
        with cpu_clock(clock):
            with region("epoch"), torch.no_grad():
                model.conv(x, edge_index)  # the model's first call: instrumented now
    finally:
        h.remove()
        h.put_back()
    rows = _rows()
    assert rows["epoch"].total * 1e9 < TOOL
    assert rows["epoch/forward (no grad)"].count == 1
    assert rows[SETUP].total * 1e9 >= TOOL


def test_a_loaders_pass_leaves_the_tools_work_out():
    from instrumented_convs.workers import Recorder

    clock = Ticking()
    with cpu_clock(clock):
        rec = Recorder(region=None, workers=False).install()
        try:
            loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
            before = tool_time()
            for i, _ in enumerate(loader):
                clock.advance(WORK)
                if i == 1:
                    with setup():
                        clock.advance(TOOL)
            (got,) = rec.result()["loaders"]
        finally:
            rec.close()
    assert tool_time() - before >= TOOL
    assert got["batches"] == 4 and got["passes"] == 1
    assert 4 * WORK <= got["span"] < 4 * WORK + 200 * READ
