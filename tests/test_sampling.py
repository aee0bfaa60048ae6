"""Backward sampling (configure(backward_every=N)): the first N calls of each graph shape are
timed, then one in N at random; every call is counted, and the time of the others is
estimated from the calls timed at random. Exact fake-clock times make the estimates exact."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs import region, registry
from instrumented_convs.core import native
from instrumented_convs.core.backward import anchor, sampling
from instrumented_convs.layers import step
from instrumented_convs.report import Summary

from .fakes import Advance

SEC = 1e-9


@pytest.fixture
def every_fourth(monkeypatch):
    """backward_every=4, and the random draw deterministic: one call in four after the census."""
    draws = itertools.cycle([0.0, 0.9, 0.9, 0.9])  # 0.0 * 4 < 1: timed; 0.9 * 4 >= 1: counted
    monkeypatch.setattr(sampling, "_random", lambda: next(draws))
    ic.configure(backward_every=4)
    yield


@pytest.fixture(params=["fast exit", "Python exit"])
def exit_path(request, monkeypatch):
    """Both paths of an anchor's exit: the C extension's (when in use) and _anchor's."""
    monkeypatch.setattr(anchor, "fast_exit", request.param == "fast exit")
    return request.param


def _run(clock, calls, ns_of_call):
    """``calls`` forward+backward passes of @step("f"), call i's backward taking ns_of_call(i)."""
    n = [0]

    @step("f")
    def f(v):
        return Advance.apply(v, clock, ns_of_call(n[0]))

    for i in range(calls):
        x = torch.randn(3, requires_grad=True)
        with region("fwd"):
            y = f(x)
        with region("bwd"):
            y.sum().backward()
        n[0] += 1
    return registry.summary()


def test_backward_every_1_times_every_call(clock):
    ic.configure(backward_every=1)
    s = _run(clock, 40, lambda i: 100)
    row = s["bwd/f"]
    assert (row.phase, row.count, row.estimated) == ("backward", 40, 0)
    assert row.total == pytest.approx(40 * 100 * SEC)
    assert "~" not in str(s)


def test_census_then_one_in_n_counts_every_call_and_estimates_the_rest(
    clock, every_fourth, exit_path
):
    s = _run(clock, 100, lambda i: 100)
    row = s["bwd/f"]
    timed = 4 + 96 // 4  # the census, then one in four
    assert (row.count, row.estimated) == (100, 100 - timed)
    assert row.total == pytest.approx(100 * 100 * SEC)  # every call took 100 ns: exact
    assert row.mean == pytest.approx(100 * SEC) and row.min == row.max == pytest.approx(100 * SEC)
    assert s["fwd/f"].count == 100 and s["fwd/f"].estimated == 0  # forward: every call timed


def test_the_estimate_comes_from_the_random_calls_not_the_census(clock, every_fourth, exit_path):
    """The census (first calls, often slow: warm-up) counts once, as itself; the calls counted
    only are estimated at the mean of the calls timed at random."""
    s = _run(clock, 100, lambda i: 1000 if i < 4 else 100)
    row = s["bwd/f"]
    assert row.total == pytest.approx((4 * 1000 + 96 * 100) * SEC)
    assert row.max == pytest.approx(1000 * SEC) and row.min == pytest.approx(100 * SEC)
    assert s["bwd"].total == pytest.approx(row.total)  # the region holds every backward
    assert s["bwd"].self_time == pytest.approx(0.0, abs=1e-15)


def test_table_and_exports_say_which_rows_are_estimated(clock, every_fourth):
    s = _run(clock, 40, lambda i: 100)
    text = str(s)
    assert "~" in text and "estimated" in text
    row = s["bwd/f"]
    assert row.estimated == 40 - (4 + 36 // 4)
    for again in (Summary.from_json(s.to_json()), Summary.from_csv(s.to_csv())):
        assert again["bwd/f"].estimated == row.estimated and again["bwd/f"].count == row.count


def test_the_users_random_stream_is_left_alone(clock):
    random.seed(1234)
    state = random.getstate()
    _run(clock, 60, lambda i: 100)
    assert random.getstate() == state


def test_a_forward_whose_backward_never_runs_counts_no_backward(clock, every_fourth):
    @step("g")
    def g(v):
        return Advance.apply(v, clock, 10)

    x = torch.randn(3, requires_grad=True)
    for _ in range(20):
        g(x).sum().backward()
    for _ in range(20):
        g(x)  # evaluation under grad, no backward
    s = registry.summary()
    assert s["g"].count == 40 and [r.count for r in s.rows if r.phase == "backward"] == [20]


def test_the_c_extension_counts_at_the_anchors_exit_without_pythons_finish(
    clock, every_fourth, exit_path, monkeypatch
):
    """After the census, the C fast path chooses and counts (or hands a sampled call to
    _anchor.chosen) itself: _anchor.finish runs for the census calls only."""
    finished = []
    real = anchor.finish
    monkeypatch.setattr(anchor, "finish", lambda *a: finished.append(1) or real(*a))
    s = _run(clock, 100, lambda i: 100)
    assert (s["bwd/f"].count, s["bwd/f"].estimated) == (100, 100 - (4 + 96 // 4))
    fast = exit_path == "fast exit" and native.speedups is not None
    assert len(finished) == (4 if fast else 100)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_counted_calls_keep_gradients_and_count_each_pass(every_fourth, exit_path):
    """A real layer: counted calls (one hook in the output's own hook dict) leave gradients
    bit-identical to stock's, a user's tensor hook on the output still runs, and with
    retain_graph each pass counts."""
    gnn = pytest.importorskip("torch_geometric.nn")
    from instrumented_convs.pyg import GCNConv

    torch.manual_seed(0)
    stock = gnn.GCNConv(6, 5)
    ours = GCNConv(6, 5)
    ours.load_state_dict(stock.state_dict())
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 12, (2, 40), generator=g)
    seen = []
    for _ in range(30):
        x = torch.randn(12, 6, generator=g)
        grads = []
        for layer in (stock, ours):
            layer.zero_grad()
            out = layer(x, ei)
            out.register_hook(lambda grad: seen.append(1))
            loss = out.pow(2).sum()
            loss.backward(retain_graph=True)
            loss.backward()
            grads.append([p.grad.clone() for p in layer.parameters()])
        for a, b in zip(*grads):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert len(seen) == 30 * 2 * 2
    s = registry.summary()
    bw = s["GCNConv"]
    assert s["GCNConv"].count == 30
    rows = {r.name: r for r in s.rows if r.phase == "backward"}
    assert rows["GCNConv"].count == 60 and rows["GCNConv"].estimated > 0
    assert rows["GCNConv/propagate/message"].count == 60
    assert bw.estimated == 0


@pytest.mark.parametrize("returns", ["newest tensor", "older tensor", "tuple"])
def test_counted_calls_count_exactly_whatever_the_anchor_returns(
    clock, every_fourth, exit_path, returns
):
    """The anchor's exit counts a call on the newest of its outputs' nodes: directly when its
    one output is its newest node, else after gathering every output (the general path); an
    anchor that declares several outputs has every call timed (the loss may not use the one
    a count hook would be on: a heterogeneous layer's outputs per node type)."""

    @step("h")
    def h(v):
        a = Advance.apply(v, clock, 100)
        later = a * 2  # a node after a's: a is then not the anchor's newest
        if returns == "newest tensor":
            return later
        if returns == "older tensor":
            return a
        return a, later

    for _ in range(60):
        x = torch.randn(3, requires_grad=True)
        out = h(x)
        loss = sum(t.sum() for t in out) if isinstance(out, tuple) else out.sum()
        with region("bwd"):
            loss.backward()
    s = registry.summary()
    row = s["bwd/h"]
    counted = 0 if returns == "tuple" else 60 - (4 + 56 // 4)
    assert (row.count, row.estimated) == (60, counted)
    assert row.total == pytest.approx(60 * 100 * SEC)


def test_counted_calls_stay_exact_past_the_registrys_queue_of_skipped_calls(
    clock, every_fourth, exit_path
):
    """The count hook appends to the registry's queue (C: its common case); at SKIPS_FOLD_AT
    (1,024) queued the Python path appends and folds them: no count is lost either way."""
    s = _run(clock, 1500, lambda i: 100)
    assert (s["bwd/f"].count, s["bwd/f"].estimated) == (1500, 1500 - (4 + 1496 // 4))
    if native.speedups is not None:
        assert sampling.Count is native.speedups.CountHook


def test_a_backward_run_on_a_thread_with_no_step_open_counts_under_the_forwards(
    clock, every_fourth, exit_path
):
    """No step open on the thread running the backward (as on CUDA's device threads): the
    count goes under the step open on the forward's thread (here none: the root)."""
    import threading

    @step("g")
    def g(v):
        return Advance.apply(v, clock, 100)

    for _ in range(40):
        x = torch.randn(3, requires_grad=True)
        y = g(x)
        t = threading.Thread(target=lambda: y.sum().backward())
        t.start()
        t.join()
    s = registry.summary()
    rows = {r.name: r for r in s.rows if r.phase == "backward"}
    assert (rows["g"].count, rows["g"].estimated) == (40, 40 - (4 + 36 // 4))
