"""``python -m instrumented_convs check``: it passes here (CPU, ``--quick``), each section has a
case that makes it fail, and the CUDA branches run against fake CUDA events, synthesised
kernel traces and a patched ``torch.cuda``. (On a GPU the GPU tests of test_cuda_timing.py,
test_pyg.py and test_dgl.py run the same functions for real.)"""

from __future__ import annotations

import itertools
import json
import warnings
from types import SimpleNamespace
from typing import Dict

import pytest
import torch

from instrumented_convs import registry
from instrumented_convs.commands.check import (
    FAIL,
    PASS,
    SKIPPED,
    Section,
    accuracy,
    cost,
    cuda,
    environment,
    equivalence,
    run,
)
from instrumented_convs.commands.check._cases import Case, cases
from instrumented_convs.commands.check._profile import Event, label_times, read
from instrumented_convs.core.native.versions import key

from .fakes import FakeEvent
from .helpers import ROOT, failing_lines, run_script

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def _case(cls: str, kind: str = "edge_index") -> Case:
    return next(c for c in cases() if c.cls == cls and c.kind == kind)


# -- the command ---------------------------------------------------------------------------


def test_check_quick_passes_on_this_cpu_and_writes_its_json(tmp_path):
    out = tmp_path / "check.json"
    proc = run_script(
        "-m", "instrumented_convs", "check", "--quick", "--json", str(out), timeout=900
    )
    doc = json.loads(out.read_text())
    assert doc["passed"] and doc["counts"]["FAIL"] == 0 and doc["device"] == "cpu"
    titles = [s["title"] for s in doc["sections"]]
    assert [t.split(".")[0] for t in titles] == ["1", "2", "3", "4", "5"]
    assert "== PASSED" in proc.stdout
    sync = next(s for s in doc["sections"] if s["title"].startswith("3."))
    assert [x["status"] for x in sync["lines"]] == [SKIPPED]  # no CUDA here: said so


def test_check_refuses_cuda_without_a_device_and_fails_with_status_1(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = run_script("-m", "instrumented_convs", "check", "--device", "cuda", expect=2)
    assert "torch sees no CUDA device" in proc.stderr
    from instrumented_convs.commands import check

    def failing(device, quick, progress):
        s = Section("x", "")
        s.add("a line", FAIL, "made to fail")
        return s

    monkeypatch.setitem(check.SECTIONS, "environment", failing)
    report = run("cpu", True, ["environment"])
    assert report.failed and "== FAILED: 0 passed, 1 failed" in report.render()
    assert json.loads(report.to_json())["passed"] is False


# -- 1. equivalence ------------------------------------------------------------------------


def test_equivalence_passes_bit_for_bit_and_fails_on_a_difference(monkeypatch):
    pytest.importorskip("torch_geometric")
    import instrumented_convs.pyg as P

    case = _case("GCNConv", "edge_weight")
    status, detail, data = equivalence.run_case(case, CPU, 30)
    assert status == PASS and "bit for bit" in detail and data["max_abs_diff"] == 0
    forward = P.GCNConv.forward
    monkeypatch.setattr(P.GCNConv, "forward", lambda self, *a, **k: forward(self, *a, **k) * 1.001)
    status, detail, _ = equivalence.run_case(case, CPU, 30)
    assert status == FAIL and "differs from the stock layer" in detail


def test_equivalence_where_stock_differs_from_itself_allows_that_much(monkeypatch):
    """Atomic scatter-adds on a GPU sum in another order each run: stood in for by noise of
    1e-6 added to both layers' outputs, drawn anew each call. Ours passes within twice what
    stock differs from itself; 1e-3 off fails; without stock noise, bit for bit is asked."""
    pytest.importorskip("torch_geometric")
    import torch_geometric.nn as stock_nn

    import instrumented_convs.pyg as P

    noise = torch.Generator().manual_seed(9)

    def noisy(cls, extra=0.0):
        forward = cls.forward

        def call(self, *a, **k):
            out = forward(self, *a, **k)
            return out + 1e-6 * torch.rand(out.shape, generator=noise) + extra

        monkeypatch.setattr(cls, "forward", call)

    noisy(stock_nn.GCNConv)
    noisy(P.GCNConv)
    status, detail, data = equivalence.run_case(_case("GCNConv"), CPU, 30)
    assert status == PASS and "run-to-run" in detail, detail
    assert 0 < data["max_abs_diff"] <= equivalence.SPREAD * data["stock_spread"]
    noisy(P.GCNConv, 1e-3)
    status, detail, _ = equivalence.run_case(_case("GCNConv"), CPU, 30)
    assert status == FAIL and "differs from the stock layer" in detail


def test_equivalence_allows_a_few_units_in_the_last_place_where_stock_is_not_deterministic(
    monkeypatch,
):
    """Seen on an H100: TransformerConv's bias gradient (about 200) off by one unit in the
    last place (1.5e-5) after three stock reruns within 5.7e-6 of the first. Stood in for:
    a row of both layers' outputs at 200, one unit more in ours; stock's own runs differing
    by one unit of 1.0 elsewhere in the tensor. Passes within 8 units; 1e-3 off fails;
    the same unit where stock never differs from itself fails (bit for bit is asked)."""
    pytest.importorskip("torch_geometric")
    import torch_geometric.nn as stock_nn

    import instrumented_convs.pyg as P

    calls = itertools.count()

    def scaled(cls, extra_units=0.0, noisy=True):
        forward = cls.forward

        def call(self, *a, **k):
            out = forward(self, *a, **k) * 0  # the first row about 200, the others about 1
            eps = torch.finfo(out.dtype).eps
            flip = float(next(calls) % 2) if noisy else 0.0  # one unit, every other run
            return torch.cat(
                [out[:1] + 200.0 + extra_units * 200.0 * eps, out[1:] + 1.0 + flip * eps]
            )

        monkeypatch.setattr(cls, "forward", call)

    scaled(stock_nn.GCNConv)
    scaled(P.GCNConv, 1.0)
    status, detail, data = equivalence.run_case(_case("GCNConv"), CPU, 30)
    assert status == PASS and "units in the last place" in detail, (detail, data)
    assert data["max_abs_diff"] > equivalence.SPREAD * data["stock_spread"]
    scaled(P.GCNConv, 1e-3 / (torch.finfo(torch.float32).eps * 200.0))
    assert equivalence.run_case(_case("GCNConv"), CPU, 30)[0] == FAIL
    scaled(stock_nn.GCNConv, noisy=False)
    scaled(P.GCNConv, 1.0, noisy=False)
    status, detail, _ = equivalence.run_case(_case("GCNConv"), CPU, 30)
    assert status == FAIL and "differs from the stock layer" in detail


def test_equivalence_fails_on_a_state_dict_that_differs(monkeypatch):
    pytest.importorskip("torch_geometric")
    make = Case.make

    def with_a_buffer(self, stock):
        m = make(self, stock)
        if not stock:
            m.register_buffer("extra", torch.ones(1))
        return m

    monkeypatch.setattr(Case, "make", with_a_buffer)
    status, detail, _ = equivalence.run_case(_case("SAGEConv"), CPU, 20)
    assert status == FAIL and "state_dict" in detail


def test_equivalence_on_cuda_needs_cuda_events(fake_cuda, monkeypatch):  # noqa: F811
    """The CUDA branch, with fake events: a layer timed on the CPU clock fails it; one timed
    with (fake) CUDA events passes."""
    pytest.importorskip("torch_geometric")
    from instrumented_convs.layers.contract import InstrumentedLayer

    case = _case("GCNConv")
    status, detail, _ = equivalence.run_case(case, CUDA, 20, place=CPU)
    assert status == FAIL and "not with CUDA events" in detail
    step_of = InstrumentedLayer._ic_step
    monkeypatch.setattr(InstrumentedLayer, "_ic_step", lambda self, d: step_of(self, CUDA))
    status, detail, _ = equivalence.run_case(case, CUDA, 20, place=CPU)
    assert status == PASS, detail


# -- 2. accuracy -----------------------------------------------------------------------------


def _ours(**rows):
    return {(p.replace(".", "/"), ph): {"count": 1, "total": ns} for (p, ph), ns in rows.items()}


def _ours_row(*ns):
    """Our side of a step: its calls' times (ns), started in this order."""
    return {"count": len(ns), "total": sum(ns), "calls": [(i, v) for i, v in enumerate(ns)]}


def _label_row(*ns):
    """The profiler's side of a step on the CPU: its labels' durations (ns), in order."""
    calls = [(i, v, 0) for i, v in enumerate(ns)]
    return {"count": len(ns), "total": sum(ns), "span": 0, "sum": 0, "kernels": 0, "calls": calls}


def test_accuracy_compares_long_and_short_steps_and_counts_on_the_cpu():
    theirs = {
        ("GCNConv", "forward"): _label_row(1_000_000),
        ("GCNConv/lin", "forward"): _label_row(30_000),
        ("GCNConv/bias", "forward"): _label_row(4_000, 4_000),
        ("", "empty forward"): {"label_adds_p90_ns": 500},
    }
    s = Section("t", "")
    ours = {
        ("GCNConv", "forward"): _ours_row(980_000),  # -2%
        ("GCNConv/lin", "forward"): _ours_row(10_000),  # 20 us short
        ("GCNConv/bias", "forward"): _ours_row(4_000),
    }
    accuracy.compare(ours, theirs, False, s)
    got = {line.name: line.status for line in s.lines}
    assert got == {"GCNConv": PASS, "GCNConv/lin": FAIL, "GCNConv/bias": FAIL}  # 1 call, 2 labels
    ours[("GCNConv", "forward")] = _ours_row(900_000)  # -10%
    ours[("GCNConv/lin", "forward")] = _ours_row(27_000)  # 3 us short: within 5
    s = Section("t", "")
    accuracy.compare(ours, theirs, False, s)
    got = {line.name: line.status for line in s.lines}
    assert got["GCNConv"] == FAIL and got["GCNConv/lin"] == PASS


def test_accuracy_measures_a_model_again_while_a_step_fails_and_shows_the_best_attempt(
    monkeypatch,
):
    """A burst of another program lands in one attempt's labels: the model is measured again
    (3 attempts at most) and the attempt with the fewest failing steps is shown, saying so;
    a step that fails every attempt fails."""
    theirs = {("lin", "forward"): _label_row(*[200_000] * 5), ("", "empty forward"): {}}
    off = {("lin", "forward"): _ours_row(*[180_000] * 5)}  # -10%
    right = {("lin", "forward"): _ours_row(*[199_000] * 5)}
    made = []

    def measure(platform, shape, device, repeats):
        made.append(platform)
        return (off if len(made) == 1 else right), theirs

    monkeypatch.setattr(accuracy, "measure", measure)
    lines = accuracy._best_attempt("pyg", "synthetic-quick", torch.device("cpu"), "PyG: ")
    assert len(made) == 2 and [(x.name, x.status) for x in lines] == [("PyG: lin", PASS)]
    assert lines[0].data["attempts"] == 2 and lines[0].detail.endswith("(the best of 2 attempts)")

    made.clear()
    monkeypatch.setattr(accuracy, "measure", lambda *a: (made.append(1), (off, theirs))[1])
    lines = accuracy._best_attempt("pyg", "synthetic-quick", torch.device("cpu"), "PyG: ")
    assert len(made) == accuracy.ATTEMPTS == 3 and [x.status for x in lines] == [FAIL]
    made.clear()
    monkeypatch.setattr(accuracy, "measure", lambda *a: (made.append(1), (right, theirs))[1])
    lines = accuracy._best_attempt("pyg", "synthetic-quick", torch.device("cpu"), "PyG: ")
    assert len(made) == 1 and "attempts" not in lines[0].data and "best of" not in lines[0].detail


def test_accuracy_allows_a_long_step_what_the_label_adds_when_that_is_more_than_5_percent():
    """Under load the label's own cost grows (measured: a 130 us backward step read -5.9%,
    7.3 us, with 8 us of label added to an empty step in that run): no error of ours."""
    theirs = {
        ("lin", "backward"): _label_row(*[130_000] * 9),
        ("", "empty backward"): {"label_adds_p90_ns": 8_000 / accuracy.LABELS["backward"]},
    }
    s = Section("t", "")
    accuracy.compare({("lin", "backward"): _ours_row(*[122_700] * 9)}, theirs, False, s)
    assert s.lines[0].status == PASS and "the label adds" in s.lines[0].detail
    s = Section("t", "")
    accuracy.compare({("lin", "backward"): _ours_row(*[121_000] * 9)}, theirs, False, s)
    assert s.lines[0].status == FAIL  # 9 us: more than 5% and more than the label adds


def test_accuracy_allows_a_backward_step_the_labels_of_the_steps_that_end_inside_it():
    """In backward, the labels of the steps directly inside a step close in the hook that
    closes its own, after our reading of its clock: each adds once more what a label adds
    (seen in CI: DGL GraphConv/norm_src's backward, 2 inner calls a call). Its allowance
    grows with them; a step with nothing inside, as far off, still fails; so does one off by
    more than its inner labels allow."""
    theirs = {
        ("conv/norm_src", "backward"): _label_row(*[60_000] * 6),
        ("", "empty backward"): {"label_adds_p90_ns": 1_000},  # 6 us a label: 6x its p90
    }
    inner = {  # two steps inside, one call each per call of norm_src: 3x the 6 us
        ("conv/norm_src/pow", "backward"): _ours_row(*[9_000] * 6),
        ("conv/norm_src/clamp", "backward"): _ours_row(*[9_000] * 6),
        ("conv/norm_src/pow/deeper", "backward"): _ours_row(*[1_000] * 36),  # not direct
    }
    theirs_all = {
        **theirs,
        **{k: _label_row(*(c[1] for c in v["calls"])) for k, v in inner.items()},
    }

    def verdict(ours_us: int, with_inner: bool = True) -> str:
        ours = {("conv/norm_src", "backward"): _ours_row(*[ours_us * 1000] * 6)}
        s = Section("t", "")
        accuracy.compare({**ours, **inner} if with_inner else ours, theirs_all, False, s)
        return {line.name: line.status for line in s.lines}["conv/norm_src [backward]"]

    assert verdict(45) == PASS  # 15 us short of its label: within 18
    assert verdict(45, with_inner=False) == FAIL  # nothing inside: over 6 us
    assert verdict(40) == FAIL  # 20 us: over 18


def test_accuracy_pairs_calls_in_order_and_judges_the_median_difference():
    """A preemption inside one call's label, outside our readings, moves the mean by 11%
    (the failure CI once saw on a loaded machine) but not the median; a step off in most of
    its calls still fails. Calls pair by the order they started, not by their position."""
    theirs = {("GCNConv/propagate", "backward"): _label_row(*[110_000] * 5 + [170_000])}
    ours = {("GCNConv/propagate", "backward"): _ours_row(*[108_000] * 6)}
    s = Section("t", "")
    accuracy.compare(ours, theirs, False, s)
    (line,) = s.lines
    assert line.status == PASS and line.data["diff_us"] == -2.0
    assert line.data["ours_mean_us"] == 108.0 and line.data["profiler_mean_us"] == 120.0
    theirs = {("GCNConv/propagate", "backward"): _label_row(*[120_000] * 4 + [108_000] * 2)}
    s = Section("t", "")
    accuracy.compare(ours, theirs, False, s)
    assert s.lines[0].status == FAIL  # four of six calls 10% short
    timeline = [  # as the timeline holds them, by when they ended: the outer call last
        ("lin", "lin", None, "step", "forward", 5_000, 105_000, 1, -1, None),
        ("lin", "lin", None, "step", "forward", 0, 300_000, 1, -1, None),
    ]
    mine = accuracy._ours(timeline, False)
    assert mine[("lin", "forward")]["calls"] == [(0, 300_000), (5_000, 100_000)]
    s = Section("t", "")
    accuracy.compare(mine, {("lin", "forward"): _label_row(300_000, 100_000)}, False, s)
    assert s.lines[0].status == PASS and s.lines[0].data["diff_us"] == 0.0


def test_accuracy_judges_each_call_against_its_own_length_then_the_median_call():
    """Seen on this VM (1 run in 6 of check --quick, the flat layout and the house alike): a
    step's calls differ in length (150 us, and 2 ms on a graph's first passes), the
    profiler's clock runs ~1.6% fast against ours on the long ones, and one short call is
    preempted inside its label: the median difference (-95 us) came from the long calls and
    was judged against the median call's 5% (7.5 us). Each call against its own tolerance,
    then the median call: 8 of 9 within, a pass; most calls off still fails."""
    theirs = {
        ("message", "backward"): _label_row(*[150_000] * 4, 150_000, *[2_000_000] * 4),
        ("", "empty backward"): {"label_adds_p90_ns": 2_500},
    }
    ours = {("message", "backward"): _ours_row(*[143_000] * 4, 55_000, *[1_905_000] * 4)}
    s = Section("t", "")
    accuracy.compare(ours, theirs, False, s)
    (line,) = s.lines
    assert line.status == PASS and line.data["calls_within"] == 8, line.detail
    assert line.data["diff_us"] == -95.0 and line.data["profiler_us"] == 150.0
    ours = {("message", "backward"): _ours_row(*[130_000] * 5, *[1_905_000] * 4)}
    s = Section("t", "")
    accuracy.compare(ours, theirs, False, s)
    assert s.lines[0].status == FAIL and s.lines[0].data["calls_within"] == 4


def test_accuracy_on_cuda_reads_the_kernels_launched_inside_each_label():
    """A synthesised CUPTI trace: labels (nested, forward and backward), the CUDA runtime
    calls inside them, the kernels those launched (a kernel launched outside any label, and
    one on another thread, count for none)."""
    events = [
        Event("label", "GCNConv", 0, 1_000_000, 1, 0),
        Event("label", "lin", 100_000, 400_000, 1, 0),
        Event("launch", "cudaLaunchKernel", 150_000, 160_000, 1, 7),
        Event("kernel", "gemm", 200_000, 350_000, -1, 7),
        Event("launch", "cudaLaunchKernel", 500_000, 510_000, 1, 8),
        Event("kernel", "scatter", 520_000, 900_000, -1, 8),
        Event("launch", "cudaLaunchKernel", 1_500_000, 1_510_000, 1, 9),  # outside
        Event("kernel", "late", 1_600_000, 1_700_000, -1, 9),
        Event("launch", "cudaLaunchKernel", 600_000, 610_000, 2, 10),  # another thread
        Event("kernel", "other", 650_000, 700_000, -1, 10),
        Event("label", "GCNConv [backward]", 2_000_000, 2_500_000, 1, 0),
        Event("label", "lin [backward]", 2_100_000, 2_200_000, 1, 0),
        Event("launch", "cudaLaunchKernel", 2_120_000, 2_130_000, 1, 11),
        Event("kernel", "gemm_bw", 2_140_000, 2_190_000, -1, 11),
    ]
    t = label_times(events)
    assert t[("GCNConv", "forward")] == {
        "count": 1,
        "total": 1_000_000,
        "span": 700_000,
        "sum": 530_000,
        "kernels": 2,
        "timeline": 1_000_000,
        "calls": [(0, 1_000_000, 700_000, 1_000_000)],
    }
    assert t[("GCNConv/lin", "forward")]["span"] == 150_000
    assert t[("GCNConv/lin", "backward")]["span"] == 50_000
    # the device idles between kernels here: what events bound is each label's interval
    assert t[("GCNConv/lin", "forward")]["timeline"] == 300_000
    assert t[("GCNConv/lin", "backward")]["timeline"] == 100_000
    s = Section("t", "")
    ours = {
        ("GCNConv", "forward"): _ours_row(990_000),
        ("GCNConv/lin", "forward"): _ours_row(150_000),  # its kernels' span: 150 us off
        ("GCNConv/lin", "backward"): _ours_row(95_000),
    }
    accuracy.compare(ours, t, True, s)
    got = {line.name: line.status for line in s.lines}
    assert got == {"GCNConv": PASS, "GCNConv/lin": FAIL, "GCNConv/lin [backward]": PASS}
    assert s.lines[0].data["kernel_sum_us"] == 530.0
    assert s.lines[0].data["kernel_span_us"] == 700.0


def test_accuracy_on_cuda_judges_the_interval_events_bound_on_the_devices_timeline():
    """What a pair of CUDA events measures: behind a long kernel (a busy device) a step's
    interval is its own kernels' span; on an idle device, waiting for the CPU, it is the
    time the CPU took to issue the step, however short its kernels (measured on an H100 at
    Cora's shape: lin 175 us, its kernel 15 us)."""
    events = [
        Event("label", "A", 0, 100_000, 1, 0),
        Event("launch", "cudaLaunchKernel", 10_000, 15_000, 1, 1),
        Event("kernel", "long", 20_000, 500_000, -1, 1),  # still running after B's launch
        Event("label", "B", 120_000, 150_000, 1, 0),
        Event("launch", "cudaLaunchKernel", 130_000, 135_000, 1, 2),
        Event("kernel", "queued", 500_000, 520_000, -1, 2),
        Event("label", "C", 600_000, 700_000, 1, 0),  # the device idle: it waits for the CPU
        Event("launch", "cudaLaunchKernel", 610_000, 612_000, 1, 3),
        Event("kernel", "short", 615_000, 625_000, -1, 3),
    ]
    t = label_times(events)
    assert {p: r["timeline"] for (p, _), r in t.items()} == {
        "A": 500_000,
        "B": 20_000,
        "C": 100_000,
    }
    assert t[("C", "forward")]["span"] == 10_000
    ours = {
        ("A", "forward"): _ours_row(495_000),
        ("B", "forward"): _ours_row(22_000),
        ("C", "forward"): _ours_row(98_000),
    }
    s = Section("t", "")
    accuracy.compare(ours, t, True, s)
    assert [line.status for line in s.lines] == [PASS, PASS, PASS]
    ours[("C", "forward")] = _ours_row(10_000)  # C's kernels' span is not what events bound
    ours[("B", "forward")] = _ours_row(400_000)  # B's start read before A's kernel was done
    s = Section("t", "")
    accuracy.compare(ours, t, True, s)
    assert {line.name: line.status for line in s.lines} == {"A": PASS, "B": FAIL, "C": FAIL}


def test_accuracy_on_cuda_allows_what_the_label_spends_around_our_events():
    """The label opens before our start event and closes after our end event: on a device
    that waits for the CPU its interval is longer than ours by that much, which each call's
    CPU clock shows (label minus ours). Measured on an H100 at Cora's shape: ours 30-50 us
    shorter than the label's interval (``update``, which launches nothing: ours 26.6 us, the
    label's 62.9). Ours longer than the label's interval, or shorter by more than the label
    spent around it, fails."""
    events = [
        Event("label", "lin", 0, 250_000, 1, 0),
        Event("launch", "cudaLaunchKernel", 150_000, 152_000, 1, 1),
        Event("kernel", "gemm", 155_000, 170_000, -1, 1),
    ]
    t = label_times(events)
    assert t[("lin", "forward")]["timeline"] == 250_000

    def ours(gpu_ns, cpu_ns):
        return {("lin", "forward"): {"count": 1, "total": gpu_ns, "calls": [(5, gpu_ns, cpu_ns)]}}

    def status(gpu_ns, cpu_ns):
        s = Section("t", "")
        accuracy.compare(ours(gpu_ns, cpu_ns), t, True, s)
        return s.lines[0].status, s.lines[0].data

    got, data = status(212_000, 214_000)  # 38 us short; the label 36 us longer on the CPU
    assert got == PASS and data["label_around_us"] == 36.0
    assert status(212_000, 250_000)[0] == FAIL  # the label added nothing: 38 us unexplained
    assert status(150_000, 214_000)[0] == FAIL  # 100 us short: more than 36 + 5%
    assert status(275_000, 214_000)[0] == FAIL  # 25 us longer than the label's interval


def test_accuracy_reads_our_calls_gpu_times_on_cuda_and_labels_from_a_real_profile():
    calls = [  # (name, path, scope, kind, phase, t0, t1, thread, link, gpu)
        ("GCNConv", "GCNConv", None, "step", "forward", 0, 900, 1, -1, (100, 600)),
        ("lin", "GCNConv/lin", None, "step", "forward", 10, 90, 1, -1, None),  # not on device
        ("epoch", "epoch", None, "region", "forward", 0, 1000, 1, -1, None),
    ]
    assert accuracy._ours(calls, True) == {
        ("GCNConv", "forward"): {"count": 1, "total": 500, "calls": [(0, 500, 900)]}
    }
    assert accuracy._ours(calls, False)[("GCNConv/lin", "forward")]["total"] == 80
    x = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("ours"):
            with torch.profiler.record_function("inner [backward]"):
                x @ x
    got = read(prof, {"ours", "inner [backward]"})
    assert sorted(e.name for e in got if e.kind == "label") == ["inner [backward]", "ours"]
    t = label_times(got)
    assert ("ours/inner", "backward") in t and t[("ours", "forward")]["count"] == 1


class _Kineto:
    """A Kineto event as ``read`` sees one (torch 2.13's; ``annotation`` None: torch 2.2's,
    which has no ``is_user_annotation``)."""

    def __init__(self, name, device, start, end, thread=1, corr=0, annotation=False):
        self._v = (name, device, start, end, thread, corr)
        if annotation is not None:
            self.is_user_annotation = lambda: annotation

    def name(self):
        return self._v[0]

    def device_type(self):
        return f"DeviceType.{self._v[1]}"

    def start_ns(self):
        return self._v[2]

    def duration_ns(self):
        return self._v[3] - self._v[2]

    def start_thread_id(self):
        return self._v[4]

    def correlation_id(self):
        return self._v[5]

    def linked_correlation_id(self):
        return 0


@pytest.mark.parametrize("api", ["is_user_annotation", "names only (torch 2.2)"])
def test_accuracy_on_cuda_takes_no_user_annotation_on_the_device_for_a_kernel(api):
    """Found on an H100 at Cora's shape (2026-11-27): the profiler puts the optimizer's
    ``record_function`` range on the device's timeline too (``Optimizer.step#Adam.step``, a
    "gpu_user_annotation"), its correlation id drawn from another count than the launches'.
    Taken for a kernel of the launch that had the same id early in the run, it ended with the
    last epoch, so the device seemed busy until then: every later call's timeline read 0 us
    and every row at Cora's shape failed."""
    annotation = None if api.startswith("names") else True
    kineto = [
        _Kineto("Optimizer.step#Adam.step", "CPU", 0, 1_000, corr=0, annotation=False),
        _Kineto("lin", "CPU", 10_000, 60_000),
        _Kineto("cudaLaunchKernel", "CPU", 20_000, 22_000, corr=7),
        _Kineto("gemm", "CUDA", 25_000, 30_000, thread=0, corr=7, annotation=False),
        _Kineto("Optimizer.step#Adam.step", "CUDA", 900_000, 990_000, 0, 7, annotation),
    ]
    if annotation is None:
        for e in kineto:
            e.__dict__.pop("is_user_annotation", None)
    results = SimpleNamespace(events=lambda: kineto)
    prof = SimpleNamespace(profiler=SimpleNamespace(kineto_results=results))
    got = read(prof, {"lin"})
    assert [(e.kind, e.name) for e in got] == [
        ("label", "lin"),
        ("launch", "cudaLaunchKernel"),
        ("kernel", "gemm"),
    ]
    assert label_times(got)[("lin", "forward")]["timeline"] == 50_000


# -- 3. synchronisation ---------------------------------------------------------------------


@pytest.fixture
def sync_debug(monkeypatch):
    """torch.cuda's sync debug mode and synchronize, stood in for on a machine without CUDA."""
    mode = {"now": 0}
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["now"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: mode.update(now=m))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return mode


def _syncing(n):
    def epoch():
        for _ in range(n):
            warnings.warn("called a synchronizing CUDA operation", UserWarning)

    return epoch


def test_sync_counts_the_debug_modes_warnings_and_fails_on_one_more(sync_debug):
    status, detail, data = cuda.syncs_added(_syncing(2), _syncing(2))
    assert status == PASS and data == {"stock": 2, "ours": 2}
    status, detail, data = cuda.syncs_added(
        _syncing(2), lambda: (_syncing(2)(), torch.cuda.synchronize())
    )
    assert status == FAIL and data["ours"] == 3 and "added 1" in detail
    assert sync_debug["now"] == 0  # the mode is put back


def test_sync_count_leaves_out_torchs_notice_that_the_debug_mode_is_a_prototype(sync_debug):
    """torch warns once a process, when the debug mode is first turned on, that it "does not
    yet detect all synchronizing operations": no synchronisation. Counted as one, it failed
    the first CUDA test of a process on an H100 (2026-11-26)."""

    def notice():
        warnings.warn(
            "Synchronization debug mode is a prototype feature and does not yet detect all "
            "synchronizing operations (Triggered internally at Module.cpp:1003.)",
            UserWarning,
        )

    assert cuda.count_syncs(notice) == 0
    assert cuda.count_syncs(lambda: (notice(), _syncing(1)())) == 1


def test_events_without_sync_passes_with_cuda_events_and_fails_without(
    fake_cuda,  # noqa: F811
    sync_debug,
    monkeypatch,
):
    def record(self, stream=None):  # each event 1 ms after the one before: a kernel's time
        FakeEvent.timeline += 1.0
        self.at, self.done = FakeEvent.timeline, True

    monkeypatch.setattr(FakeEvent, "record", record)
    status, detail, data = cuda.events_without_sync(CUDA, place=CPU)
    assert status == PASS and data["pending"] > 0, detail
    torch.cuda.is_current_stream_capturing = lambda: True  # fake_cuda's patch undoes it
    status, detail, data = cuda.events_without_sync(CUDA, place=CPU)
    assert status == FAIL and data["pending"] == 0


def test_sync_section_is_skipped_without_cuda():
    s = cuda.section(CPU, True)
    assert [(x.status, x.name) for x in s.lines] == [(SKIPPED, "synchronising calls")]


# -- 4. cost ---------------------------------------------------------------------------------


def _measured(enabled, disabled=1.0, aa=1.0, iqr=0.01):
    r = {"enabled": enabled, "no backward": 1.0, "disabled": disabled, "stock again": aa}
    return {
        "ratio_median": r,
        "ratio_iqr": {k: iqr for k in r},
        "rounds": 10,
        "median_s": {"stock": 0.002},
    }


def test_cost_verdicts_against_the_promise_within_the_runs_noise():
    assert cost.verdict(_measured(1.10), 1.17)[0] == PASS
    assert cost.verdict(_measured(1.19, aa=1.03), 1.17)[0] == PASS  # within the noise
    status, detail, _ = cost.verdict(_measured(1.25), 1.17)
    assert status == FAIL and "over the promise" in detail
    status, detail, _ = cost.verdict(_measured(1.05, disabled=1.08), 1.17)
    assert status == FAIL and "disabled is slower" in detail
    status, detail, _ = cost.verdict(_measured(1.5, iqr=0.4), 1.17)
    assert status == SKIPPED and "too noisy" in detail


def test_cost_on_cuda_measures_cora_and_arxiv_against_the_gpu_targets(monkeypatch):
    import instrumented_convs.commands.study.bench as bench

    seen = []

    def fake(data, platform, sparse, rounds, warmup, hidden, device):
        seen.append((platform, data.num_nodes, rounds))
        return _measured(1.05 if data.num_nodes < 10_000 else 1.08)

    monkeypatch.setattr(bench, "measure_case", fake)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: self)
    s = cost.section(CUDA, True)
    got = {x.name: (x.status, x.data.get("promise")) for x in s.lines}
    assert got["PyG GCN, cora"] == (PASS, 1.16)  # what an H200 measured (docs/performance.md)
    assert got["PyG GCN, arxiv"] == (FAIL, 1.02)  # 1.08 > 1.02: worse than measured there
    assert {n for _, n, _ in seen} == {2708, 169_343}


# -- 5. environment --------------------------------------------------------------------------


INTEGRATIONS = ("lightning", "notebook", "tensorboard")  #: extras of instrumented_convs.<name>


def test_environment_ranges_are_setup_cfgs_and_cis():
    """check's tested ranges are a copy (an installed package need not carry setup.cfg): the
    oldest is setup.cfg's lower bound, the newest the newest release CI pins; setup.cfg bounds
    no release from above (pip would downgrade a user's torch to a bound)."""
    import configparser
    import re

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].split("\n")
    for name, extra in cfg["options.extras_require"].items():
        if name not in INTEGRATIONS:  # (their own tests hold their ranges: not the layers')
            lines += extra.split("\n")
    lows = {}
    for line in filter(None, map(str.strip, lines)):
        m = re.fullmatch(r"([\w-]+)(?:>=([\d.]+))?(,<[\d.]+)?", line)
        assert m, line
        if m[1] != "dgl":  # (dgl 2.x loads on torch 2.2 only: the extra stops at 1.x)
            assert m[3] is None, f"setup.cfg bounds {m[1]} from above: {line}"
        if m[2]:
            lows[m[1]] = m[2]
    assert {"torch", "torch-geometric", "dgl", "nvtx"} <= set(lows)
    pins: Dict[str, str] = {}
    for req in ("main.txt", "dgl2.txt", "dgl2-nodeps.txt"):
        for line in (ROOT / "requirements" / req).read_text().splitlines():
            m = re.fullmatch(r"([\w-]+)==([\d.]+)", line.strip())
            if m and (m[1] not in pins or key(m[2]) > key(pins[m[1]])):
                pins[m[1]] = m[2]
    tested = {dist: (low, high) for dist, low, high in environment.TESTED}
    for dist, low in lows.items():
        assert tested.get(dist) == (low, pins[dist]), dist


def test_environment_passes_here_fails_below_and_leaves_newer_unjudged(monkeypatch):
    s = environment.section(CPU)
    assert not s.failed and {"python", "torch", "device", "C fast path"} <= {
        x.name for x in s.lines
    }
    real = environment.version
    for found, status, words in (
        ("2.1.2", FAIL, "2.1.2: older than this release runs on (2.2)"),
        ("9.9.0", SKIPPED, "9.9.0: newer than tested (2.2 to 2.14.1)"),
        ("2.14.1+cu130", PASS, "2.14.1+cu130 (tested 2.2 to 2.14.1)"),
        ("2.2.1", PASS, "2.2.1 (tested 2.2 to 2.14.1)"),
    ):
        monkeypatch.setattr(environment, "version", lambda d: found if d == "torch" else real(d))
        line = next(x for x in environment.section(CPU).lines if x.name == "torch")
        assert (line.status, line.detail[: len(words)]) == (status, words), found


def test_environment_on_cuda_reads_the_device_or_fails_without_one(monkeypatch):
    class Props:
        name, major, minor, total_memory = "NVIDIA H200", 9, 0, 141 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props())
    line = next(x for x in environment.section(CUDA).lines if x.name == "device")
    assert line.status == PASS and "NVIDIA H200, compute 9.0, 141 GiB" in line.detail
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = next(x for x in environment.section(CUDA).lines if x.name == "device")
    assert line.status == FAIL
    registry.reset()


def test_a_failed_command_leads_its_message_with_the_lines_that_failed():
    out = (
        "== 2. Accuracy\n  PASS    a step   1.0 us\n  FAIL    DGL GCN, cora   over the promise:\n"
        "                          disabled 1.0\n  PASS    another\n"
        "Traceback (most recent call last):\n  File x\nValueError: bad\n"
    )
    assert failing_lines(out) == (
        "  FAIL    DGL GCN, cora   over the promise:\n                          disabled 1.0\n"
        "ValueError: bad"
    )
    with pytest.raises(pytest.fail.Exception, match=r"(?s)exit status 3, expected 0; the lines"):
        run_script("-c", "print('  FAIL    x'); raise SystemExit(3)")
