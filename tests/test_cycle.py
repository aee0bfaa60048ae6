"""The duty cycle (``configure(record_every=K)``, ``budget=``): what it draws, what an
unrecorded iteration runs (the stock code), how the table is scaled, and where an iteration
ends (optimizer steps stepped together, closures, gradient accumulation, named regions)."""

from __future__ import annotations

import json
import math
from typing import Any, List

import pytest
import torch
import torch.nn.functional as F

import instrumented_convs as ic
from instrumented_convs.core.dutycycle import budget as budget_module
from instrumented_convs.core.dutycycle.cycle import FIRST, cycle, gap, schedule
from instrumented_convs.core.settings import switches
from instrumented_convs.report import Summary

from .helpers import ROOT, random_graph, run_script, run_torchrun

pytest.importorskip("torch_geometric")  # the models here are PyG's (DGL's beside them)


def _graph(n: int = 40, e: int = 160, seed: int = 0) -> tuple:
    return random_graph(n, e, 8, seed=seed, classes=3)


class Net(torch.nn.Module):
    """Two layers of ``conv`` (a PyG class), ReLU between, log_softmax."""

    def __init__(self, conv: Any) -> None:
        super().__init__()
        self.a, self.b = conv(8, 16), conv(16, 3)

    def forward(self, x: torch.Tensor, ei: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.b(F.relu(self.a(x, ei)), ei), dim=-1)


def _train(model: torch.nn.Module, steps: int, data: tuple) -> List[float]:
    x, ei, y = data
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.nll_loss(model(x, ei), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# -- the draw ----------------------------------------------------------------------------------
def test_the_draw_is_the_same_in_every_process_and_not_aliased():
    n = 40_000
    recorded = schedule(10, n)
    assert recorded == schedule(10, n)  # a function of the seed and the iteration numbers
    assert recorded[:FIRST] == list(range(FIRST))
    drawn = [False] * n
    for i in recorded:
        drawn[i] = True
    share = sum(drawn[FIRST:]) / (n - FIRST)
    assert abs(share - 0.1) < 0.01
    # work every N iterations is not aliased: each residue class is drawn at the same rate
    for period in (2, 5, 10):
        for r in range(period):
            cls = drawn[FIRST + r :: period]
            assert abs(sum(cls) / len(cls) - 0.1) < 0.02, (period, r)
    # independent: after a recorded iteration the next is recorded at the same rate
    after = [drawn[i + 1] for i in recorded[FIRST:-1]]
    assert abs(sum(after) / len(after) - 0.1) < 0.025
    assert schedule(1, 50) == list(range(50))
    assert all(gap(i, 1) == 1 for i in range(100))


def test_configure_checks_its_arguments_and_puts_the_cycle_back():
    for bad in (0, -2, 1.5, True, "10"):
        with pytest.raises((TypeError, ValueError), match="record_every"):  # (a type, a range)
            ic.configure(record_every=bad)
    for bad in (0, 1, 1.5, -0.1, True):
        with pytest.raises((TypeError, ValueError), match="budget"):
            ic.configure(budget=bad)
    with pytest.raises(ValueError, match="give one of them"):
        ic.configure(record_every=10, budget=0.01)
    with pytest.raises(ValueError, match="iteration"):
        ic.configure(iteration="a/b")
    assert not cycle.on
    with ic.configure(record_every=7) as before:
        assert before.record_every == 1 and cycle.on and cycle.every == 7
        assert ic.configure().record_every == 7
    assert not cycle.on and switches.enabled and switches.drawn


# -- equivalence ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["GCNConv", "GATConv", "SAGEConv"])
def test_a_cycled_run_trains_exactly_as_stock(name):
    """Losses, gradients and state of a run recorded one iteration in 3 equal stock's."""
    import torch_geometric.nn as stock

    import instrumented_convs.pyg as ours

    data = _graph()
    torch.manual_seed(0)
    ref = Net(getattr(stock, name))
    mine = Net(getattr(ours, name))
    mine.load_state_dict(ref.state_dict())
    with ic.configure(record_every=3):
        got = _train(mine, 30, data)
        assert ic.registry.summary().sampling["recorded"] < 30  # some ran the stock code
    want = _train(ref, 30, data)
    assert got == want
    for (k, a), (_, b) in zip(ref.state_dict().items(), mine.state_dict().items()):
        assert torch.equal(a, b), k
    for a, b in zip(ref.parameters(), mine.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_a_cycled_dgl_run_trains_exactly_as_stock():
    dgl = pytest.importorskip("dgl")
    import dgl.nn as stock

    import instrumented_convs.dgl as ours

    x, ei, y = _graph()
    g = dgl.add_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=x.shape[0]))

    class DglNet(torch.nn.Module):
        def __init__(self, mod: Any) -> None:
            super().__init__()
            self.a, self.b = mod.GraphConv(8, 16), mod.GraphConv(16, 3)

        def forward(self, x: torch.Tensor, g: Any) -> torch.Tensor:
            return F.log_softmax(self.b(g, F.relu(self.a(g, x))), dim=-1)

    torch.manual_seed(0)
    ref, mine = DglNet(stock), DglNet(ours)
    mine.load_state_dict(ref.state_dict())
    with ic.configure(record_every=3):
        got = _train(mine, 30, (x, g, y))
    assert got == _train(ref, 30, (x, g, y))
    for (k, a), (_, b) in zip(ref.state_dict().items(), mine.state_dict().items()):
        assert torch.equal(a, b), k


def test_an_unrecorded_iteration_records_nothing():
    from instrumented_convs.pyg import GCNConv

    data = _graph()
    model = Net(GCNConv)
    x, ei, y = data
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with ic.configure(record_every=4):
        for _ in range(40):
            before = sum(e.count + e.skipped for e in ic.registry.entries())
            now = switches.drawn
            opt.zero_grad()
            F.nll_loss(model(x, ei), y).backward()
            opt.step()
            after = sum(e.count + e.skipped for e in ic.registry.entries())
            assert (after > before) == now


# -- scaling -------------------------------------------------------------------------------------
def test_counts_and_totals_are_scaled_to_the_whole_run():
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    with ic.configure(record_every=5):
        _train(model, 100, _graph())
    s = ic.registry.summary()
    assert s.sampling["iterations"] == 100 and s.sampling["every"] == 5
    recorded = s.sampling["recorded"]
    assert FIRST < recorded < 60
    row = s["GCNConv"]
    assert row.count == 200  # two calls an iteration: the estimate is exact then
    assert row.sampled == 2 * recorded
    assert row.se > 0 and row.total > 0
    # the scaled total is the recorded one times its weight (the first iterations exact)
    exact, sampled = ic.registry.strata
    assert exact.every == 0 and exact.recorded == FIRST and sampled.every == 5
    raw = {(e.path, e.phase): e for e in ic.registry.snapshot()}
    w = sampled.iterations / sampled.recorded
    total = sum(
        e.total * e.weight
        for e in ic.registry.snapshot()
        if e.path == "GCNConv" and e.phase == "forward"
    )
    assert math.isclose(row.total, total * 1e-9, rel_tol=1e-9)
    assert any(e.weight == w for e in raw.values())
    # the table says so, and the marks
    table = s.table()
    assert "Sampled: " in table and f"{recorded} of 100 iterations" in table and "±SE" in table
    line = next(line for line in table.splitlines() if line.startswith("- GCNConv "))
    assert "~200" in line
    # JSON keeps it; a full run's table has no such column
    back = Summary.from_json(s.to_json())
    assert back.sampling == s.sampling and back.rows == s.rows
    ic.registry.reset()
    _train(model, 3, _graph())
    assert "±SE" not in ic.registry.summary().table()


def test_the_standard_error_covers_the_truth():
    """Recorded one in 4, the estimate of a step's total lies within 3 standard errors of
    the total of every call (a step whose calls take a known, varying time)."""
    from instrumented_convs.layers import step
    from instrumented_convs.testing import FakeClock, cpu_clock

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)  # an autograd op between steps: an iteration each
    g = torch.Generator().manual_seed(3)
    truth = 0
    with cpu_clock(FakeClock()) as clock, ic.configure(record_every=4, backward=False):
        for _ in range(400):
            for _ in range(3):
                ns = int(torch.randint(1000, 9000, (1,), generator=g))
                truth += ns
                with step("work"):
                    clock.advance(ns)
            (p * 2).sum().backward()
            opt.step()
    row = ic.registry.summary()["work"]
    assert row.count == 1200
    assert abs(row.total - truth * 1e-9) < 3 * row.se, (row.total, truth * 1e-9, row.se)


# -- where an iteration ends ---------------------------------------------------------------------
def test_optimizers_stepped_together_are_one_iteration():
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    x, ei, y = _graph()
    a = torch.optim.Adam(model.a.parameters(), lr=0.01)
    b = torch.optim.SGD(model.b.parameters(), lr=0.01)
    with ic.configure(record_every=3):
        for _ in range(30):
            a.zero_grad()
            b.zero_grad()
            F.nll_loss(model(x, ei), y).backward()
            a.step()
            b.step()
    s = ic.registry.summary()
    assert s.sampling["iterations"] == 30
    assert s["GCNConv"].count == 60


def test_gradient_accumulation_and_closures_are_one_iteration_each():
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    x, ei, y = _graph()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with ic.configure(record_every=2):
        for _ in range(20):
            opt.zero_grad()
            for _ in range(4):  # four micro-batches, one step
                F.nll_loss(model(x, ei), y).backward()
            opt.step()
    s = ic.registry.summary()
    assert s.sampling["iterations"] == 20 and s["GCNConv"].count == 160
    ic.registry.reset()

    lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    calls = []

    def closure() -> torch.Tensor:
        lbfgs.zero_grad()
        loss = F.nll_loss(model(x, ei), y)
        loss.backward()
        calls.append(1)
        return loss

    with ic.configure(record_every=2):
        for _ in range(12):
            lbfgs.step(closure)
    s = ic.registry.summary()
    assert s.sampling["iterations"] == 12  # each step with a closure is one
    rows = s["GCNConv"]
    assert abs(rows.count - 2 * len(calls)) <= 2 * 3 * 2  # estimated: closures per step vary


def test_named_iterations_and_what_is_outside_them():
    """``configure(iteration="train")``: calls of region("train") are the iterations; the
    evaluation outside them is recorded in full, not scaled."""
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    x, ei, y = _graph()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with ic.configure(record_every=4, iteration="train"):
        for _ in range(40):
            with ic.region("train"):
                opt.zero_grad()
                F.nll_loss(model(x, ei), y).backward()
                opt.step()
            with torch.no_grad(), ic.region("evaluate"):
                model(x, ei)
    s = ic.registry.summary()
    assert s.sampling["iteration"] == "train" and s.sampling["iterations"] == 40
    train, evaluate = s["train"], s["evaluate"]
    assert train.count == 40 and train.sampled and train.se > 0
    assert evaluate.count == 40 and not evaluate.sampled and evaluate.se == 0
    assert s["evaluate/GCNConv"].count == 80 and not s["evaluate/GCNConv"].sampled
    assert s["train/GCNConv"].count == 80 and s["train/GCNConv"].sampled


def test_a_user_region_around_iterations_keeps_its_own_stratum():
    """A region open across iterations (an epoch around optimizer steps) is recorded in the
    stratum it opened in; the steps inside it go to the iteration's."""
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    with ic.configure(record_every=3):
        with ic.region("all"):
            _train(model, 60, _graph())
    s = ic.registry.summary()
    assert s["all"].count == 1 and not s["all"].sampled
    assert s["all/GCNConv"].count == 120 and s["all/GCNConv"].sampled


def test_disabled_by_the_user_stays_disabled():
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    with ic.configure(record_every=2), ic.configure(enabled=False):
        _train(model, 10, _graph())
    assert ic.registry.entries() == []
    assert switches.enabled


def test_a_reset_starts_the_strata_again():
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    with ic.configure(record_every=3):
        _train(model, 20, _graph())
        ic.registry.reset()
        _train(model, 30, _graph())
        s = ic.registry.summary()
    assert s.sampling["iterations"] == 30
    assert s["GCNConv"].count == 60


# -- budget --------------------------------------------------------------------------------------
def test_the_budget_picks_the_smallest_rate_under_it():
    b = budget_module.Budget(0.01)
    for _ in range(5):
        b.add(True, 1_150_000)
    for _ in range(20):
        b.add(False, 1_000_000)
    assert b.ready(100)
    assert b.propose() == 15  # +15% a recorded iteration: one in 15 adds 1%
    assert "+15.0%" in b.why and "one in 15" in b.why
    b.recorded.clear()
    for _ in range(5):
        b.add(True, 990_000)  # recording costs nothing measurable: record everything
    assert b.propose() == 1
    # the cycle's own hooks take 0.5% of an iteration: the room left for recording is 1.5%
    b = budget_module.Budget(0.02)
    for _ in range(5):
        b.add(True, 1_150_000)
    for _ in range(20):
        b.add(False, 1_000_000)
        b.own.append(5_000)
    assert b.propose() == 10 and "own hooks 0.50%" in b.why


def test_a_budget_run_says_what_it_chose(monkeypatch):
    from instrumented_convs.pyg import GCNConv

    monkeypatch.setattr(budget_module, "DECIDE_EVERY", 8)
    monkeypatch.setattr(budget_module.Budget, "propose", lambda self: 40)
    model = Net(GCNConv)
    with ic.configure(budget=0.02):
        assert ic.configure().budget == 0.02
        _train(model, 400, _graph())
        s = ic.registry.summary()
    assert s.sampling["budget"] == 0.02 and s.sampling["every"] == 40
    assert [st["every"] for st in s.sampling["strata"]] == [0, 10, 20, 40]  # doubling at most
    assert s["GCNConv"].count == 800  # the strata of both rates scaled, added
    assert "Budget 2%" in s.table()


# -- outputs -------------------------------------------------------------------------------------
def test_the_timeline_shows_the_recorded_iterations():
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    with ic.configure(record_every=4, timeline=100_000):
        _train(model, 40, _graph())
        trace = ic.registry.timeline().to_chrome()
        recorded = ic.registry.summary().sampling["recorded"]
    iterations = [e for e in trace["traceEvents"] if e.get("cat") == "iteration"]
    assert len(iterations) == recorded  # every recorded one (the last ended with its step)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert "iterations recorded (duty cycle)" in names
    layers = [e for e in trace["traceEvents"] if e.get("name") == "GCNConv"]
    assert len(layers) == 2 * recorded
    # the first iteration began before the first call: the trace starts at it (no negative
    # times, which Perfetto drops)
    assert min(e["ts"] for e in trace["traceEvents"] if e["ph"] == "X") >= 0


def test_diff_counts_the_calls_a_sampled_row_recorded():
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    with ic.configure(record_every=5):
        _train(model, 100, _graph())
        sampled = ic.registry.summary()
    ic.registry.reset()
    _train(model, 20, _graph())
    full = ic.registry.summary()
    d = full.diff(sampled)
    row = next(r for r in d.rows if r.name == "GCNConv" and r.phase == "forward")
    a, b = row.a, row.b
    want = math.sqrt(a.std**2 / a.count + b.std**2 / b.sampled)
    assert math.isclose(row.error, want, rel_tol=1e-9)
    assert "b is a sampled run (" in d.table() and "a is a sampled run" not in d.table()


def test_run_records_every_k_iterations_of_an_unmodified_script(tmp_path):
    out = tmp_path / "run"
    proc = run_script(
        "-m",
        "instrumented_convs",
        "run",
        "--record-every",
        "4",
        "-o",
        str(out),
        str(ROOT / "tests" / "scripts" / "plain_pyg.py"),
        "--epochs",
        "40",
    )
    assert "Sampled: " in proc.stdout and "±SE" in proc.stdout
    run = json.loads((out / "run.json").read_text())
    assert run["sampling"]["every"] == 4 and run["settings"]["record_every"] == 4
    assert run["sampling"]["iterations"] == 40 + 3  # 40 epochs, then 3 mini-batches
    s = Summary.load(out)
    assert s.sampling == run["sampling"]
    assert any(r.sampled for r in s.rows)
    view = run_script("-m", "instrumented_convs", "view", str(out))
    assert "Sampled: " in view.stdout
    page = (out / "page.html").read_text()
    assert "Sampled: " in page and "\\u00b1SE (" in page  # the note; the column, in JSON
    bad = run_script(
        "-m",
        "instrumented_convs",
        "run",
        "--record-every",
        "4",
        "--budget",
        "0.01",
        "x.py",
        expect=2,
    )
    assert "not allowed with" in bad.stderr


@pytest.mark.parametrize("mode,value", [("every", "4"), ("budget", "0.01")])
def test_every_rank_records_the_same_iterations(tmp_path, mode, value):
    run_torchrun(str(ROOT / "tests" / "cycle_worker.py"), str(tmp_path), mode, value)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["drawn"] == ranks[1]["drawn"]
    assert not all(ranks[0]["drawn"])
    assert ranks[0]["every"] == ranks[1]["every"]
    if mode == "budget":
        assert ranks[0]["every"] == 6  # the largest of the ranks' proposals (3 and 6)
    for r in ranks:
        assert r["sampling"]["iterations"] == 60
        assert r["count"] == 2 * 60 * 2  # two layers, 60 iterations, two ranks


def test_a_compiled_model_never_recompiles_for_the_switch():
    """The cycle flips the switch every iteration; Dynamo must not guard on it (a guard
    would recompile the model at each flip: error_on_recompile raises then)."""
    import torch._dynamo

    from instrumented_convs.pyg import GCNConv

    torch._dynamo.reset()
    model = Net(GCNConv)
    compiled = torch.compile(model, backend="eager")
    x, ei, y = _graph()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration() -> None:
        opt.zero_grad()
        F.nll_loss(compiled(x, ei), y).backward()
        opt.step()

    with ic.configure(record_every=2):
        for _ in range(3):  # compiled once, recorded and not
            iteration()
        drawn_seen = set()
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in range(12):
                drawn_seen.add(switches.drawn)
                iteration()
    assert drawn_seen == {True, False}
    torch._dynamo.reset()


def test_the_census_of_backward_timing_is_taken_once_for_the_run():
    """Which calls' backward is timed step by step (the first ``backward_every`` of each
    shape, then one in N) is one count for the whole run: a layer's template in a sampled
    stratum goes on from the exact stratum's, so the sampled iterations take no census of
    their own (a recorded iteration would cost more after a pause than in full)."""
    from instrumented_convs.pyg import GCNConv

    model = Net(GCNConv)
    with ic.configure(record_every=2, backward_every=4):
        _train(model, 40, _graph())
    exact, sampled = ic.registry.strata
    a = exact.root.children[("GCNConv", model.a.scope)]
    b = sampled.root.children[("GCNConv", model.a.scope)]
    (ta,) = a.sampling.values()
    (tb,) = b.sampling.values()
    assert ta.records == tb.records
    recorded = ic.registry.summary().sampling["recorded"]
    assert ta.calls == FIRST and tb.calls == recorded  # one count: the exact ones, then these
