"""On demand, in this process: nothing recorded until a capture asks, then exactly the
iterations asked, written off the loop's thread, and the stock code in between.

The captures are asked for as a user asks, with the ``capture`` command (run in a thread of
this process, talking to this process's listener over its socket), or through the core's
:class:`~instrumented_convs.core.dutycycle.demand.Demand` where a test needs a state no
command can make on purpose (a rank that began late). Jobs in their own processes (``run
--on-demand``, torchrun, the environment) are ``tests/test_capture.py``'s.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time

import pytest
import torch
import torch.nn.functional as F

import instrumented_convs as ic
from instrumented_convs import core
from instrumented_convs.commands.cli import main as cli_main
from instrumented_convs.commands.launch import listening, ondemand
from instrumented_convs.commands.launch.hooks import Hooks
from instrumented_convs.core.dutycycle.demand import NEVER, Busy, Demand
from instrumented_convs.layers import step
from instrumented_convs.report import Summary

from .fakes import FakeEvent
from .helpers import counts, random_graph

pyg = pytest.importorskip("torch_geometric")


def _graph(n=60, e=300):
    return random_graph(n, e, 8, classes=3)


class Net(torch.nn.Module):
    def __init__(self, gcn, sage):
        super().__init__()
        self.conv1, self.conv2 = gcn(8, 16), sage(16, 3)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


def _models():
    from instrumented_convs.pyg import GCNConv, SAGEConv

    torch.manual_seed(1)
    ours = Net(GCNConv, SAGEConv)
    stock = Net(pyg.nn.GCNConv, pyg.nn.SAGEConv)
    stock.load_state_dict(ours.state_dict())
    return ours, stock


class Trainer:
    """A model, its optimizer, and one training step a call (its loss kept)."""

    def __init__(self, model, region=None):
        self.model, self.region = model, region
        self.opt = torch.optim.Adam(model.parameters(), lr=0.01)
        self.x, self.edge_index, self.y = _graph()
        self.losses = []

    def step(self):
        with ic.region(self.region) if self.region else contextlib.nullcontext():
            self.opt.zero_grad()
            loss = F.cross_entropy(self.model(self.x, self.edge_index), self.y)
            loss.backward()
            self.opt.step()
        self.losses.append(loss.item())


class Asked:
    """The ``capture`` command run in a thread of this process: its exit code and output."""

    def __init__(self, *argv):
        self.code = None
        self.out, self.err = io.StringIO(), io.StringIO()
        self.thread = threading.Thread(target=self._run, args=(argv,), daemon=True)
        self.thread.start()

    def _run(self, argv):
        with contextlib.redirect_stdout(self.out), contextlib.redirect_stderr(self.err):
            self.code = cli_main(["capture", *map(str, argv)])

    def armed(self, timeout=30):
        """Wait until the job has the capture (asked, not begun)."""
        deadline = time.monotonic() + timeout
        while core.on_demand.capture is None:
            assert self.thread.is_alive() or self.code is None, self.err.getvalue()
            assert time.monotonic() < deadline, "the capture was never armed"
            time.sleep(0.01)

    def result(self, train=None, timeout=240):
        """Train with ``train()`` (if given) until the command has its answer."""
        deadline = time.monotonic() + timeout
        while self.thread.is_alive():
            assert time.monotonic() < deadline, "capture did not end"
            if train is not None:
                train()
            else:
                time.sleep(0.01)
        return self.code, self.out.getvalue().strip(), self.err.getvalue()


def test_idle_records_nothing_and_trains_bit_for_bit_as_stock(tmp_path):
    ours, stock = _models()
    a, b = Trainer(ours), Trainer(stock)
    ic.configure(record="on-demand", captures=tmp_path)
    for _ in range(6):
        a.step()
        b.step()
    assert a.losses == b.losses
    assert not list(ic.registry.summary())  # nothing recorded
    assert core.on_demand.listening
    (ann,) = listening.announcements_in(tmp_path)
    assert ann["folder"] == str(tmp_path.resolve()) and listening.alive(ann)


def test_a_capture_records_exactly_the_iterations_asked_and_the_job_goes_on(tmp_path):
    ours, stock = _models()
    a, b = Trainer(ours, region="epoch"), Trainer(stock)
    ic.configure(record="on-demand", captures=tmp_path)
    for _ in range(3):
        a.step()
    asked = Asked(tmp_path, "--iterations", 4)
    asked.armed()
    code, out, err = asked.result(train=a.step)
    assert code == 0, err
    assert out == str(tmp_path / "capture-1")
    saved = json.loads((tmp_path / "capture-1" / "run.json").read_text())
    c = counts(Summary.load(tmp_path / "capture-1"))
    assert c[("epoch", "forward")] == 4  # the iterations asked, exactly
    assert c[("epoch/GCNConv", "forward")] == c[("epoch/SAGEConv", "forward")] == 4
    assert c[("epoch/GCNConv", "backward")] == 4
    first = saved["capture"]["first"]
    assert saved["capture"]["last"] == first + 3 and saved["capture"]["complete"]
    assert first == 5  # 3 was under way when asked, 4 the warm-up (recorded and dropped)
    assert "Captured on demand: iterations 5-8" in (tmp_path / "capture-1/summary.txt").read_text()
    for _ in range(4):  # back to recording nothing, and to the stock code
        a.step()
    assert counts(ic.registry.summary()) == c  # (the capture's, and nothing after it)
    while len(b.losses) < len(a.losses):
        b.step()
    assert a.losses == b.losses


def test_a_second_capture_while_one_is_under_way_is_refused_and_says_so(tmp_path):
    a = Trainer(_models()[0])
    ic.configure(record="on-demand", captures=tmp_path)
    a.step()
    first = Asked(tmp_path, "--iterations", 3)
    first.armed()
    second = Asked(tmp_path, "--iterations", 3)
    code, out, err = second.result()
    assert code == 1 and out == ""
    assert "cannot take a capture now" in err and "under way" in err, err
    assert "capture-1" in err and "not begun yet" in err
    assert not (tmp_path / "capture-2").exists()  # its folder given back
    code, out, err = first.result(train=a.step)
    assert code == 0 and out.endswith("capture-1"), err


class Owner:
    """The duty cycle as a :class:`Demand` sees it: the iteration under way, the next seen,
    whether a named iteration is open, and whether the one under way did anything."""

    def __init__(self):
        self.i, self._next, self._open = 0, NEVER, None

    def did_something(self):
        return True


@pytest.fixture
def demand():
    owner = Owner()
    d = Demand(owner)
    d.on = d.listening = True
    d.handed = []
    d.finished = d.handed.append
    d.owner = owner
    return d


def begins(demand, i):
    """Iteration ``i`` begins, as the cycle sees it: recorded or not, and the next boundary."""
    demand.owner.i = i
    return demand.begins(i), demand.owner._next


def test_every_rank_begins_where_asked_and_is_handed_over_a_boundary_after(demand):
    demand.owner.i = 3
    c = demand.ask(2, start=10, name="capture-1")
    assert demand.owner._next == 9  # the cycle sees 9 begin (the warm-up), none before
    assert begins(demand, 9) == (True, 10) and c.state == "warming"
    assert begins(demand, 10) == (True, 11) and (c.state, c.first) == ("recording", 10)
    assert begins(demand, 11) == (True, 12)
    assert begins(demand, 12) == (False, 13) and not demand.handed  # what is open closes
    assert (c.state, c.recorded) == ("complete", 2) and demand.recording()
    assert begins(demand, 12) == (False, 13)  # (a boundary taken back, and taken again)
    assert begins(demand, 13) == (False, NEVER) and demand.handed == [c]
    assert (c.first, c.recorded, c.state, c.complete) == (10, 2, "writing", True)
    assert not demand.cancel("capture-1")  # handed over: it is written
    with pytest.raises(Busy, match="capture-1 is under way"):
        demand.ask(2, name="capture-2")
    demand.written(c)
    demand.owner.i = 20
    for start in (20, 21):  # 21 may be beginning now: the loop would not see it asked
        with pytest.raises(Busy) as late:
            demand.ask(2, start=start, name="capture-2")
        assert late.value.late
    late_one = demand.ask(2, start=25, name="capture-2")
    assert begins(demand, 25) == (True, 26) and late_one.first == 25  # no warm-up: it came late
    demand.stop("the job ended")
    demand.written(late_one)
    missed = demand.ask(2, start=30, name="capture-3")
    assert begins(demand, 31) == (False, NEVER)  # it never saw 30 begin: it says so
    assert missed.state == "missed" and "iteration 31" in missed.reason


def test_cancelled_and_cut_short_captures_are_handed_over_as_such(demand):
    c = demand.ask(3, name="capture-1")
    assert demand.owner._next == 0  # the next boundary, whichever it is
    assert demand.cancel("capture-1") and demand.handed == [c]  # (whoever waits hears)
    assert c.state == "cancelled" and demand.owner._next == NEVER
    demand.written(c)
    c = demand.ask(3, name="capture-2")
    assert begins(demand, 3) == (True, 4) and c.state == "warming"
    assert begins(demand, 4) == (True, 5) and c.first == 4
    assert demand.cancel("capture-2") and demand.owner._next == 5
    assert begins(demand, 5) == (False, NEVER) and demand.handed[-1] is c
    assert c.state == "cancelled"
    demand.written(c)
    c = demand.ask(5, name="capture-3")
    begins(demand, 6)  # (the warm-up)
    begins(demand, 7)
    begins(demand, 8)
    assert demand.stop("the job ended") is c
    assert (c.state, c.recorded, c.reason, c.complete) == ("writing", 1, "the job ended", False)
    assert c.part and c.describe()["last"] == 8  # iteration 7, and part of 8
    demand.written(c)
    c = demand.ask(1, name="capture-4")
    begins(demand, 9)
    begins(demand, 10)
    begins(demand, 11)  # complete, its hand-over at the next boundary: the job ends first
    assert demand.stop("the job ended") is c and c.complete and c.reason is None
    demand.written(c)
    c = demand.ask(4, name="capture-5")
    begins(demand, 12)
    assert demand.stop("the job ended") is c and c.state == "cancelled"  # (in its warm-up)
    demand.written(c)
    c = demand.ask(4, name="capture-6")
    begins(demand, 13)
    begins(demand, 14)
    assert demand.stop("the registry was reset", drop=True) is c and c.state == "cancelled"


def test_optimizers_stepped_together_are_one_iteration_of_a_capture(tmp_path):
    """``opt_a.step(); opt_b.step()`` is one iteration: a capture of 3 holds both steps of
    each, the last one's second step too (the hand-over waits for the next boundary)."""
    from instrumented_convs.pyg import GCNConv

    torch.manual_seed(0)
    x, edge_index, y = _graph()
    conv_a, conv_b = GCNConv(8, 3), GCNConv(8, 3)
    opt_a = torch.optim.SGD(conv_a.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(conv_b.parameters(), lr=0.1)
    hooks = Hooks(on_demand=True).install()
    try:
        ic.configure(record="on-demand", captures=tmp_path)

        def train():
            loss = F.cross_entropy(conv_a(x, edge_index) + conv_b(x, edge_index), y)
            loss.backward()
            opt_a.step()
            opt_b.step()

        train()
        asked = Asked(tmp_path, "--iterations", 3)
        asked.armed()
        code, out, err = asked.result(train=train)
    finally:
        hooks.close()
        hooks.remove()
    assert code == 0, err
    c = counts(Summary.load(out))
    assert c[("optimizer.step", "forward")] == 6
    assert c[("forward", "forward")] == c[("forward/GCNConv", "forward")] == 6  # 2 calls each
    assert c[("backward", "forward")] == 3


def test_named_iterations_on_demand_record_nothing_outside_them(tmp_path):
    a = Trainer(_models()[0], region="train step")
    ic.configure(record="on-demand", iteration="train step", captures=tmp_path)

    def train():
        a.step()
        a.model(a.x, a.edge_index)  # outside the iterations: never recorded

    train()
    asked = Asked(tmp_path, "--iterations", 2)
    asked.armed()
    code, out, err = asked.result(train=train)
    assert code == 0, err
    saved = json.loads((tmp_path / "capture-1" / "run.json").read_text())
    c = counts(Summary.load(out))
    assert c == {k: v for k, v in c.items() if k[0].startswith("train step")}
    assert c[("train step", "forward")] == 2 and c[("train step/GCNConv", "forward")] == 2
    assert saved["capture"]["of"] == "train step"
    assert "calls of the region 'train step'" in (tmp_path / "capture-1/summary.txt").read_text()


def test_turning_it_off_mid_capture_writes_what_was_recorded(tmp_path, caplog):
    a = Trainer(_models()[0], region="epoch")
    ic.configure(record="on-demand", captures=tmp_path)
    a.step()
    asked = Asked(tmp_path, "--iterations", 50)
    asked.armed()
    for _ in range(4):
        a.step()
    ic.configure(record="all")
    code, out, err = asked.result()
    assert code == 1 and out.endswith("capture-1")
    assert "holds 2 of the 50 iterations asked (on demand was turned off)" in caplog.text
    assert counts(Summary.load(out))[("epoch", "forward")] == 2  # after its warm-up
    saved = json.loads((tmp_path / "capture-1" / "run.json").read_text())
    assert not saved["capture"]["part"]  # (it had done nothing yet)
    assert not core.on_demand.listening and not listening.announcements_in(tmp_path)


def test_configure_refuses_on_demand_with_a_duty_cycle_and_puts_it_back(tmp_path):
    with pytest.raises(ValueError, match="not with record_every or budget"):
        ic.configure(record="on-demand", record_every=5)
    with pytest.raises(ValueError, match="not with record_every or budget"):
        ic.configure(record="on-demand", budget=0.01)
    with pytest.raises(TypeError, match="captures takes a folder"):
        ic.configure(captures=3)
    with ic.configure(record="on-demand", captures=tmp_path) as before:
        assert before.record == "all"
        now = ic.configure()
        assert (now.record, now.captures) == ("on-demand", str(tmp_path))
        with pytest.raises(ValueError, match="configure\\(record='all'\\) first"):
            ic.configure(record_every=10)
        assert listening.announcements_in(tmp_path)
    assert ic.configure().record == "all" and not core.on_demand.on
    assert not listening.announcements_in(tmp_path) and ondemand.current() is None


def test_on_cuda_the_captures_events_are_read_by_the_writer_not_the_loop(
    tmp_path,
    fake_cuda,  # noqa: F811
):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    loop = threading.get_ident()
    waited = []
    original = FakeEvent.synchronize

    def synchronize(self):
        waited.append(threading.get_ident())
        original(self)

    FakeEvent.synchronize = synchronize
    try:
        ic.configure(record="on-demand", captures=tmp_path)

        def train():
            with step("GCNConv", device="cuda"):
                FakeEvent.timeline += 2.0
            (param * 2).sum().backward()  # (an autograd op: the next step is another iteration)
            opt.step()

        train()
        asked = Asked(tmp_path, "--iterations", 3)
        asked.armed()
        code, out, err = asked.result(train=train)
    finally:
        FakeEvent.synchronize = original
    assert code == 0, err
    row = Summary.load(out)["GCNConv"]
    assert row.count == 3 and row.total == pytest.approx(6e-3)
    assert waited and loop not in waited  # the writer waited for the events, the loop never


def test_a_reset_during_a_capture_drops_it_and_says_why(tmp_path):
    a = Trainer(_models()[0], region="epoch")
    ic.configure(record="on-demand", captures=tmp_path)
    a.step()
    asked = Asked(tmp_path, "--iterations", 50)
    asked.armed()
    for _ in range(3):
        a.step()
    ic.registry.reset()  # what the capture held is gone
    code, out, err = asked.result(train=a.step)
    assert code == 1 and "was not written: the registry was reset" in err, err
    assert not (tmp_path / "capture-1" / "run.json").exists()
    assert core.on_demand.capture is None  # the next may come


def test_turning_it_off_with_a_duty_cycle_stops_listening_and_back_on_listens_where_it_did(
    tmp_path,
):
    a = Trainer(_models()[0])
    ic.configure(record="on-demand", captures=tmp_path)
    a.step()
    with ic.configure(record="all", record_every=10):  # the cycle after on demand is off
        assert not listening.announcements_in(tmp_path) and not core.on_demand.listening
        a.step()
    assert listening.announcements_in(tmp_path)  # back on: in the same folder
    asked = Asked(tmp_path, "--iterations", 2)
    asked.armed()
    code, out, err = asked.result(train=a.step)
    assert code == 0 and out == str(tmp_path / "capture-1"), err


def test_a_rank_0_that_missed_the_start_still_merges_the_others(tmp_path):
    from instrumented_convs.commands.launch.ondemand import Server
    from instrumented_convs.commands.launch.runs import run_meta, write_run
    from instrumented_convs.core.dutycycle.demand import Capture

    folder = tmp_path / "capture-1"
    with step("GCNConv"):
        pass
    meta = run_meta(["train.py"], "train.py", [], time.time(), "captured", None)
    write_run(folder, ic.registry.snapshot(), meta, job=(1, 2))  # rank 1's file
    missed = Capture(1, 3, 10, "capture-1")
    missed.state, missed.reason = "missed", "the job was at iteration 11 when it began"
    server = Server(tmp_path, lambda c: {}, job=(0, 2), merge_timeout=5.0)
    told = server._write(missed)
    assert not told["ok"] and told["merged"] == {"ranks_missing": [0]}
    merged = Summary.load(folder)
    assert merged.world_size == 2 and merged["GCNConv"].count == 1


def test_memory_and_counters_are_on_for_the_captured_iterations_only(tmp_path):
    from instrumented_convs.core.meters import counters as counters_module

    a = Trainer(_models()[0], region="epoch")
    ondemand.listen(tmp_path, counters=True, memory=True)
    ic.configure(record="on-demand")
    a.step()
    assert not ic.configure().counters and not ic.configure().memory  # idle: off
    seen = counters_module.seen
    a.step()
    assert counters_module.seen == seen  # no op went through the counters' mode
    asked = Asked(tmp_path, "--iterations", 2)
    asked.armed()
    code, out, err = asked.result(train=a.step)
    assert code == 0, err
    rows = {r.name: r for r in Summary.load(out)}
    assert rows["epoch/GCNConv/lin"].flops > 0 and rows["epoch/GCNConv"].peak_bytes > 0
    assert sum(r.saved_bytes for r in rows.values()) > 0
    assert not ic.configure().counters and not ic.configure().memory  # off again
