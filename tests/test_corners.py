"""Three corners where a table said more than was measured: the eager breakdown's rows (the
eager iterations', not scaled to a run whose other iterations ran compiled), ``diff``'s floor
(a change too small to act on, and a run with itself, are unchanged), and the ``copy`` region
(a batch's copy by the training loop, not a ``.to()`` inside a graph library)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import instrumented_convs as ic
from instrumented_convs.commands.cli import main as cli_main
from instrumented_convs.commands.launch.runs import write_run
from instrumented_convs.core.compiler import dynamo, eager
from instrumented_convs.report import Summary

from .fakes import row as _row
from .helpers import run_script, train_losses

# -- the eager breakdown ----------------------------------------------------------------------


class _GCN(torch.nn.Module):
    def __init__(self, conv: type) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv(8, 16), conv(16, 3)

    def forward(self, x: torch.Tensor, ei: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.conv2(F.relu(self.conv1(x, ei)), ei), dim=-1)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    dynamo.forget()
    yield
    torch._dynamo.reset()
    dynamo.forget()


def test_the_eager_breakdown_rows_are_the_eager_iterations_not_the_whole_run(fresh_dynamo):
    """Under ``record_every=4`` three iterations in four ran compiled and recorded nothing:
    the rows count the eager iterations' calls, unscaled, and the note sets a compiled
    iteration's time beside an eager one's."""
    pyg = pytest.importorskip("instrumented_convs.pyg")
    if not eager.AVAILABLE:
        pytest.skip("this torch has no torch.compiler.set_stance")
    g = torch.Generator().manual_seed(0)
    x, ei = torch.randn(30, 8, generator=g), torch.randint(0, 30, (2, 120), generator=g)
    y = torch.randint(0, 3, (30,), generator=g)
    with ic.configure(compiled="eager", record_every=4):
        train_losses(torch.compile(_GCN(pyg.GCNConv), backend="aot_eager"), (x, ei), y, 20)
        s = ic.registry.summary()
    recorded, iterations = s.sampling["recorded"], s.sampling["iterations"]
    assert iterations == 20 and recorded < iterations
    rows = {r.name: r for r in s.rows if r.phase == "forward"}
    assert rows["GCNConv"].count == 2 * recorded  # two layers an eager iteration
    assert not any(r.sampled for r in s.rows)  # nothing scaled, nothing marked ~
    table = s.table()
    assert "~" not in table.split("\n-----")[0] and "±SE" not in table
    assert f"rows are the {recorded} recorded iterations' own, not scaled" in table
    assert "an iteration took compiled " in table and "?" not in table


def test_the_eager_breakdown_with_every_iteration_recorded_says_what_there_is():
    """No compiled iteration to time: the note gives the eager time and why there is no
    compiled one, not ``compiled ? ms (0)``."""
    from instrumented_convs.report.text import eager_note

    if not eager.AVAILABLE:
        pytest.skip("this torch has no torch.compiler.set_stance")
    e = eager.Eager()
    try:
        e.set(True, True)
        for i in range(8):  # every iteration recorded (so eager), the first 3 left out
            e.drawn(True)
            e.ended(i, 3, True, 2_000_000)
    finally:
        e.set(False, False)
    note = eager_note(e.describe())
    assert "?" not in note and "eager 2 ms (5)" in note, note
    assert "none ran compiled" in note and "--record-every" in note, note
    d = e.describe()
    d["eager"] = {"iterations": 0, "ms": None}
    note = eager_note(d)
    assert "?" not in note and "none was timed" in note, note


# -- diff's floor -----------------------------------------------------------------------------


def _verdicts(a: list, b: list, **kw) -> dict:
    return {d.name: d.verdict for d in Summary(a).diff(Summary(b), **kw)}


def test_diff_calls_a_change_under_its_floor_unchanged_and_states_the_floor():
    """0.6 µs a call (+26%) is below the floor of 1 µs a call: unchanged, where it was
    "slower"; 3 µs a call is still slower, and the floor is stated under the table."""
    from instrumented_convs.report.diff import MIN_CHANGE, MIN_CHANGE_US

    assert (MIN_CHANGE, MIN_CHANGE_US) == (0.05, 1.0)
    a = [_row("f", 1e-3, 1e-5), _row("f/tiny", 2.3e-6, 1e-8, 1000), _row("f/big", 2.3e-6, 1e-8)]
    b = [_row("f", 1e-3, 1e-5), _row("f/tiny", 2.9e-6, 1e-8, 1000), _row("f/big", 5.3e-6, 1e-8)]
    assert _verdicts(a, b) == {"f": "unchanged", "f/tiny": "unchanged", "f/big": "slower"}
    # a floor asked for: 0.5 µs a call, and the tiny change counts again
    assert _verdicts(a, b, min_change_us=0.5)["f/tiny"] == "slower"
    text = str(Summary(a).diff(Summary(b)))
    assert "The floor: 5% of a's mean or 1 µs a call, the larger" in text, text


def test_a_run_diffed_with_itself_is_unchanged_everywhere(tmp_path, capsys):
    """Noisy rows (a wide spread, a single call) of a run compared with themselves."""
    rows = [_row("f", 1e-3, 2e-3), _row("f/one", 5e-4, 0.0, count=1), _row("g", 2e-6, 4e-6, 3)]
    assert set(_verdicts(rows, rows).values()) == {"unchanged"}
    ic.registry.reset()
    for s in (0.010, 0.031, 0.002, 0.017) * 3:
        ic.registry.add("epoch", s)
    write_run(tmp_path / "a", ic.registry.snapshot(), {"exit_code": 0})
    ic.registry.reset()
    assert cli_main(["diff", str(tmp_path / "a"), str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "unchanged: 1" in out and "too noisy" not in out.split("The floor")[0], out


# -- copy: a batch's, by the training loop ---------------------------------------------------


def test_a_to_inside_dgl_is_no_copy_a_loops_is():
    """``dgl.graph`` calls ``.to`` on the graph it builds, ``khop_graph`` through it: no
    ``copy``; the loop's own ``g.to(device)`` and ``g.cpu()`` are copies."""
    dgl = pytest.importorskip("dgl")
    from instrumented_convs.workers import copies

    remove = copies.install()
    try:
        ic.registry.reset()
        with ic.region("epoch"):
            src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
            g = dgl.graph((src, dst), num_nodes=3)
            dgl.khop_graph(g, 2)
            g = g.to("cpu")
            g = g.cpu()
        names = {r.name: r.count for r in ic.registry.summary().rows}
    finally:
        remove()
        ic.registry.reset()
    assert names == {"epoch": 1, "epoch/copy": 2}, names


_DGL_SCRIPT = """
import torch, dgl
import torch.nn.functional as F
from dgl.nn import GraphConv

torch.manual_seed(0)
conv = GraphConv(4, 3, allow_zero_in_degree=True)
opt = torch.optim.Adam(conv.parameters(), lr=0.01)
for epoch in range(3):
    src, dst = torch.randint(0, 50, (200,)), torch.randint(0, 50, (200,))
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=50))  # built on the CPU: no copy
    loss = F.cross_entropy(conv(g, torch.randn(50, 4)), torch.randint(0, 3, (50,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")
"""


def test_run_on_a_dgl_script_that_copies_nothing_has_no_copy_row(tmp_path):
    pytest.importorskip("dgl")
    script = tmp_path / "train_dgl.py"
    script.write_text(_DGL_SCRIPT)
    out = tmp_path / "run"
    run_script("-m", "instrumented_convs", "run", "--quiet", "-o", str(out), str(script))
    rows = json.loads((out / "run.json").read_text())["summary"]["rows"]
    names = [r["name"] for r in rows]
    assert "optimizer.step" in names and "GraphConv" in " ".join(names), names
    assert not [n for n in names if n.split("/")[-1] == "copy"], names
