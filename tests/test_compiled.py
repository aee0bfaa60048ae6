"""torch.compile: ``run`` changes nothing Dynamo compiles, a compiled model's calls are a
row of their own with its conv layers listed, graph breaks are attributed to the layer whose
code caused them, and the eager breakdown gives a compiled model's steps.

Dynamo's own counters (``torch._dynamo.utils.counters``) are compared between processes that
run the same script (``tests/scripts/compiled_probe.py``) plainly, under ``run``, with the
import swapped and both; the backend is aot_eager (Dynamo's frames, guards and graph breaks
are inductor's, without its compile time)."""

from __future__ import annotations

import importlib.util
import json
import linecache
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict

import pytest
import torch
import torch.nn.functional as F

import instrumented_convs as ic
from instrumented_convs.core.compiler import dynamo, eager
from instrumented_convs.report import Summary
from instrumented_convs.report.compiled import compiled_note, layer_calls

from .helpers import ROOT, run_script, train_losses

PROBE = str(ROOT / "tests" / "scripts" / "compiled_probe.py")
COUNTERS = ("frames", "frames_ok", "graph_breaks", "graphs", "captured", "recompile_limit")


#: Every probe the tests below compare, run once each, two at a time (a process compiles on
#: one core), started by the first test that needs one.
PROBES = [
    (case, under_run, ours)
    for case, runs in (
        ("gcn", [(False, False), (True, False), (False, True), (True, True)]),
        ("gin", [(False, False), (True, False), (True, True)]),
        ("step", [(False, False), (True, False)]),
        ("rgcn", [(False, False), (True, False), (False, True), (True, True)]),
        ("reduce", [(False, False), (True, False)]),
        ("dgl", [(False, False), (True, False), (False, True), (True, True)]),
    )
    for under_run, ours in runs
]
_pool: Dict[str, Any] = {}


def _run_probe(folder: Path, case: str, under_run: bool, ours: bool) -> Dict[str, Any]:
    out = folder / f"{case}-{under_run}-{ours}.json"
    command = [PROBE, case, str(out)] + (["--ours"] if ours else [])
    run_folder = folder / f"run-{case}-{ours}"
    if under_run:  # the same script under `python -m instrumented_convs run`
        command = ["-m", "instrumented_convs", "run", "--quiet", "-o", str(run_folder), *command]
    proc = run_script(*command, timeout=600, warnings="default::UserWarning")
    result = json.loads(out.read_text())
    # What Dynamo warned of (torch 2.14 warns where it cannot trace a builtin): the same
    # warnings plainly and under run or the import swap, none of the library's own.
    result["dynamo_warnings"] = sorted(
        {line.strip() for line in proc.stderr.splitlines() if "Dynamo" in line}
    )
    if under_run:
        result["run"] = json.loads((run_folder / "run.json").read_text())
    return result


def _probe(tmp_path: Path, case: str, under_run: bool, ours: bool) -> Dict[str, Any]:
    """The probe's result for ``case`` (plainly or under ``run``, stock or ours)."""
    if not _pool:
        wanted = [k for k in PROBES if k[0] != "dgl" or _have("dgl")]
        wanted = [k for k in wanted if k[0] == "dgl" or _have("torch_geometric")]
        executor = ThreadPoolExecutor(max_workers=2)
        _pool.update({k: executor.submit(_run_probe, tmp_path, *k) for k in wanted})
        executor.shutdown(wait=False)
    return _pool[(case, under_run, ours)].result()


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _counters(result: Dict[str, Any]) -> Dict[str, Any]:
    return {k: result[k] for k in (*COUNTERS, "dynamo_warnings")}


def _summary(result: Dict[str, Any]) -> Summary:
    return Summary.from_dict(result["run"]["summary"])


@pytest.mark.parametrize("case", ["gcn", "gin", "step", "rgcn", "reduce"])
def test_run_adds_no_frame_graph_break_or_recompile_to_a_compiled_pyg_model(tmp_path, case):
    pytest.importorskip("torch_geometric")
    stock = _probe(tmp_path, case, under_run=False, ours=False)
    traced = _probe(tmp_path, case, under_run=True, ours=False)
    assert _counters(traced) == _counters(stock)
    assert traced["outputs"] == stock["outputs"]  # the same program ran
    s = _summary(traced)
    name = "compiled train_step" if case == "step" else f"compiled {case.upper()}"
    name = {"compiled RGCN": "compiled GCN", "compiled REDUCE": "compiled GCN"}.get(name, name)
    rows = [r for r in s.rows if r.step == name]
    assert rows and sum(r.count for r in rows if r.phase == "forward") == len(stock["outputs"])
    if case != "step":  # a compiled model's own backward row, timed around it
        assert any(r.phase == "backward" for r in rows)
    else:  # the backend's GraphModules, called inside the step, are not models of the script
        assert {r.name for r in s.rows} == {name, f"{name}/backward"}
        # and the model the compiled step refers to has its conv layers listed as its own
        listed = {(c["owner"], c["scope"]): c for c in layer_calls(s)}
        assert set(listed) == {(name, "conv1"), (name, "conv2")}
        assert all(c["calls"] == 4 and not c["exact"] for c in listed.values())


def test_a_layer_that_breaks_the_graph_compiles_as_stock_with_the_import_swap(tmp_path):
    """RGCNConv breaks the graph inside its forward: Dynamo then compiles the frames the
    layer's call runs, one by one. Ours runs the stock forward there, its own frame (and
    every function of ours it calls) not offered to Dynamo: the same frames as stock's."""
    pytest.importorskip("torch_geometric")
    stock = _probe(tmp_path, "rgcn", under_run=False, ours=False)
    assert stock["graph_breaks"] > 0  # (the case this test is for)
    for under_run in (False, True):
        ours = _probe(tmp_path, "rgcn", under_run=under_run, ours=True)
        assert _counters(ours) == _counters(stock) and ours["outputs"] == stock["outputs"]
    listed = layer_calls(_summary(ours))
    assert {c["scope"] for c in listed} == {"conv1", "conv2"}
    assert all(c["class"] == "RGCNConv" and c["calls"] == 8 for c in listed)


@pytest.mark.parametrize("case", ["gcn", "gin"])
def test_our_layers_compile_as_stock_does_and_are_counted_from_the_graphs(tmp_path, case):
    pytest.importorskip("torch_geometric")
    stock = _probe(tmp_path, case, under_run=False, ours=False)
    both = _probe(tmp_path, case, under_run=True, ours=True)  # the import swapped, under run
    assert _counters(both) == _counters(stock) and both["outputs"] == stock["outputs"]
    if case == "gcn":  # and the import swap alone
        ours = _probe(tmp_path, case, under_run=False, ours=True)
        assert _counters(ours) == _counters(stock) and ours["outputs"] == stock["outputs"]
    calls = layer_calls(_summary(both))
    n = {"gcn": 8, "gin": 4}[case]  # compiled calls: train and eval, or batches
    per_layer = {c["scope"]: c for c in calls}
    expected = {"gcn": {"conv1", "conv2"}, "gin": {"convs.0", "convs.1", "convs.2"}}[case]
    assert set(per_layer) == expected
    assert all(c["exact"] and c["per_call"] == 1 and c["calls"] == n for c in calls)
    assert "Ran compiled, not broken down" in compiled_note(_summary(both))


def test_a_dgl_model_compiled_under_run_compiles_as_stock(tmp_path):
    pytest.importorskip("dgl")
    try:
        stock = _probe(tmp_path, "dgl", under_run=False, ours=False)
    except pytest.fail.Exception as exc:  # torch 2.2's Dynamo with dgl 2.1: stock fails
        if "InternalTorchDynamoError" not in str(exc):
            raise
        pytest.skip("this torch's Dynamo cannot compile the stock DGL model (internal error)")
    traced = _probe(tmp_path, "dgl", under_run=True, ours=False)
    assert _counters(traced) == _counters(stock) and traced["outputs"] == stock["outputs"]
    assert stock["graph_breaks"] > 0  # DGL's graph methods break the graph in GraphConv
    for under_run in (False, True):  # the import swap: the frames Dynamo compiles are stock's
        ours = _probe(tmp_path, "dgl", under_run=under_run, ours=True)
        assert _counters(ours) == _counters(stock) and ours["outputs"] == stock["outputs"]
    listed = {c["scope"]: c for c in layer_calls(_summary(traced))}
    assert set(listed) == {"c1", "c2"} and all(not c["exact"] for c in listed.values())
    assert all(c["calls"] == 4 for c in listed.values())
    # Each break is GraphConv's (not EdgeWeightNorm's, of the same file): most lie in DGL's
    # graph code Dynamo compiled on its own, attributed to the layer's frame under it.
    breaks = _summary(ours).compiled["breaks"]
    assert len(breaks) == stock["graph_breaks"] and {b["layer"] for b in breaks} == {"GraphConv"}
    import dgl.nn.pytorch.conv.graphconv as graphconv

    forward = range(*_lines(graphconv.GraphConv.forward))
    assert all(b["file"] == "graphconv.py" and b["line"] in forward for b in breaks), breaks
    assert any(b["via"] and b["via"]["file"] != "graphconv.py" for b in breaks)


def _lines(fn: Any) -> tuple:
    """The first and one past the last line of ``fn``'s source."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first, first + len(lines)


def test_graph_breaks_are_attributed_to_the_layer_and_line_that_caused_them(tmp_path):
    pytest.importorskip("torch_geometric")
    result = _probe(tmp_path, "rgcn", under_run=True, ours=False)
    breaks = result["run"]["summary"]["compiled"]["breaks"]
    mine = [b for b in breaks if b["layer"] == "RGCNConv"]
    assert len(mine) == len(breaks) == result["graph_breaks"], breaks  # none unattributed
    import torch_geometric.nn.conv.rgcn_conv as rgcn

    for b in mine:
        assert b["file"] == "rgcn_conv.py"
        line = linecache.getline(rgcn.__file__, b["line"])
        assert line.strip(), b  # a real line of the layer's source
        assert b["function"] == "forward"  # (a resumed forward is named as such)
    # RGCNConv's data-dependent int(segment_count.max()) (an .item()): the line that does it
    texts = [linecache.getline(rgcn.__file__, b["line"]) for b in mine]
    assert any("int(" in t or ".item()" in t for t in texts), texts
    note = compiled_note(Summary.from_dict(result["run"]["summary"]))
    assert "RGCNConv:" in note and "graph break" in note and "rgcn_conv.py:" in note
    # its recompiles (a new edge_index size each call: dynamic=False), in its propagate too,
    # which PyG generates into a temporary module named for the class
    again = [r for r in result["run"]["summary"]["compiled"]["recompiles"]]
    mine = [r for r in again if r["layer"] == "RGCNConv"]
    assert any("edge_index' size mismatch" in r["reason"] for r in mine), again
    assert any(r["file"] == "<RGCNConv propagate>" for r in mine), again
    assert "Recompiles (torch.compile): RGCNConv: " in note


# -- in process: the notes, the import swap without run, the eager breakdown ------------------


class _GCN(torch.nn.Module):
    def __init__(self, conv: Any) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv(8, 16), conv(16, 3)

    def forward(self, x: torch.Tensor, ei: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.conv2(F.relu(self.conv1(x, ei)), ei), dim=-1)


def _train(model: torch.nn.Module, steps: int) -> list:
    g = torch.Generator().manual_seed(0)
    x, ei = torch.randn(30, 8, generator=g), torch.randint(0, 30, (2, 120), generator=g)
    return train_losses(model, (x, ei), torch.randint(0, 3, (30,), generator=g), steps, 0.05)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    dynamo.forget()
    yield
    torch._dynamo.reset()
    dynamo.forget()


def test_importing_registers_no_compile_callback_run_and_a_traced_layer_do():
    """Graph breaks are attributed through Dynamo's compile callbacks: registered by ``run``
    or by a layer of ours as Dynamo traces it, never by an import."""
    import subprocess
    import sys

    code = (
        "import instrumented_convs, instrumented_convs.core as c\n"
        "from torch._dynamo.callback import callback_handler as h\n"
        "n = len(h.start_callbacks)\n"
        "c.watch_compiles(); c.watch_compiles()\n"
        "print(n, len(h.start_callbacks))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if "No module named 'torch._dynamo.callback'" in out.stderr:
        pytest.skip("this torch has no compile callbacks (graph breaks: their own stacks)")
    assert out.stdout.split() == ["0", "1"], out.stderr


def test_importing_leaves_dynamo_unimported_and_tells_it_our_frames_once_it_is():
    """Importing Dynamo costs more than a second: the package does not, and what Dynamo must
    know (the frames it skips, the probe it takes as a constant) is told when it is imported,
    with the same effect as where it was imported first; the skip's effect is seen (without
    it, Dynamo compiles the frame after its graph break on its own)."""
    script = str(ROOT / "tests" / "scripts" / "dynamo_order.py")

    def probe(order: str, **env: str) -> Dict[str, Any]:
        return json.loads(run_script(script, order, env=env).stdout.splitlines()[-1])

    first, after = probe("first"), probe("after")
    assert first["dynamo_imported"] and not after["dynamo_imported"]
    assert after == dict(first, dynamo_imported=False) and after["constant"] is True
    assert after["out"] == [6.0, 6.0] and after["seen"] == [True]
    unmarked = probe("after", INSTRUMENTED_CONVS_FALLBACK="skip_code")
    assert unmarked["frames"]["total"] > after["frames"]["total"]


_GLOBAL_MODEL = torch.nn.Linear(2, 2)


def test_the_models_a_compiled_function_names_are_found():
    """``run`` lists the conv layers of the models a compiled training step refers to (its
    globals, its closure, its bound module); an unrelated module is not taken."""
    from instrumented_convs.commands.launch.models import models_of as _models_of

    inner, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def step(x: torch.Tensor) -> torch.Tensor:
        return inner(_GLOBAL_MODEL(x))

    found = _models_of(step)
    assert len(found) == 2 and {id(m) for m in found} == {id(inner), id(_GLOBAL_MODEL)}
    assert [id(m) for m in _models_of(other.forward)] == [id(other)]  # a bound method
    assert _models_of(len) == [] and _models_of(lambda: other) == [other]


def test_eager_code_knows_it_runs_inside_a_compiled_call(fresh_dynamo):
    """After a graph break, the rest of a compiled call runs its calls eagerly, Dynamo
    compiling each frame: ``inside_compiled`` says so there (a layer then runs the stock
    code), and not outside, nor under ``torch._dynamo.disable``."""
    seen = []

    def layer(x: torch.Tensor) -> torch.Tensor:  # a layer's forward, skipped as ours are
        seen.append(dynamo.inside_compiled())
        return x * 2

    dynamo.skip_frame(layer)
    off = torch._dynamo.disable(layer)

    def model(x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        torch._dynamo.graph_break()
        return off(layer(x))

    layer(torch.ones(2))
    out = torch.compile(model, backend="eager")(torch.ones(2))
    layer(torch.ones(2))
    assert out.tolist() == [8.0, 8.0] and seen == [False, True, False, False]
    # Traced (Dynamo inlines the layer), the probe folds to a constant: no graph break of its
    # own (torch 2.14 warns of one: "Dynamo does not know how to trace the builtin ...")
    reasons = " ".join(map(str, torch._dynamo.utils.counters["graph_break"]))
    assert "graph_break" in reasons.replace(" ", "_") and "eval_frame" not in reasons


def test_the_import_swap_without_run_says_its_layers_ran_compiled(fresh_dynamo):
    pyg = pytest.importorskip("instrumented_convs.pyg")
    model = _GCN(pyg.GCNConv)
    _train(torch.compile(model, backend="aot_eager"), 3)
    s = ic.registry.summary()
    assert s.compiled is not None
    uncounted = [c for c in layer_calls(s) if not c["owner"]]
    assert {c["scope"] for c in uncounted} == {model.conv1.scope, model.conv2.scope}
    assert all(c["calls"] is None for c in uncounted)
    note = compiled_note(s)
    assert "calls not counted" in note and "GCNConv" in note
    assert Summary.from_json(s.to_json()) == s  # what ran compiled is kept with the summary
    assert "calls not counted" in s.table()


def test_the_eager_breakdown_records_steps_and_puts_compiled_time_beside_eager(fresh_dynamo):
    pyg = pytest.importorskip("instrumented_convs.pyg")
    if not eager.AVAILABLE:
        pytest.skip("this torch has no torch.compiler.set_stance")
    from torch_geometric.nn import GCNConv

    torch.manual_seed(0)
    stock = _GCN(GCNConv)
    torch.manual_seed(0)
    model = _GCN(pyg.GCNConv)
    expected = _train(torch.compile(stock, backend="aot_eager"), 30)
    with ic.configure(compiled="eager", record_every=4):
        got = _train(torch.compile(model, backend="aot_eager"), 30)
        s = ic.registry.summary()
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert torch.compiler.is_compiling() is False
    names = {r.name for r in s.rows}
    assert {"GCNConv", "GCNConv/propagate", "GCNConv/lin"} <= names  # steps, from eager runs
    e = s.sampling["eager"]
    assert e["available"] and e["eager"]["iterations"] >= 1 and e["compiled"]["iterations"] >= 10
    assert e["eager"]["ms"] > 0 and e["compiled"]["ms"] > 0
    assert "an iteration took compiled" in s.table()
    assert ic.configure().compiled == "compiled"  # the block put it back
    from instrumented_convs.core.compiler.eager import _stance

    assert _stance() == "default"  # and the stance


def test_the_eager_breakdown_says_so_where_torch_cannot(monkeypatch):
    monkeypatch.setattr(eager, "AVAILABLE", False)
    e = eager.Eager()
    e.set(True, True)
    assert not e.on and e.describe()["available"] is False
    from instrumented_convs.report.text import eager_note

    assert "no torch.compiler.set_stance" in eager_note(e.describe())
    with pytest.raises(ValueError, match="compiled must be"):
        ic.configure(compiled="fast")
