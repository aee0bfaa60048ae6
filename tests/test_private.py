"""torch's private calls (instrumented_convs.core.private): each one's canary passes on this
torch, a canary that fails or raises takes the fallback with one log line and no crash, and
each fallback, forced, gives the same outputs and gradients with the rows it says it loses."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict

import pytest
import torch

from instrumented_convs.core.compiler import dynamo
from instrumented_convs.core.native import private

from .helpers import ROOT, run_script

SCRIPT = str(ROOT / "tests" / "scripts" / "fallbacks.py")
#: The private calls tests/scripts/fallbacks.py relies on (a CPU: no CUDA stream to read; no
#: loader workers).
ON_CPU = set(private.CALLS) - {"raw_stream", "worker_loop"}


def test_every_private_call_on_this_torch_passes_its_canary():
    pytest.importorskip("torch_geometric")
    assert run_fallbacks("")["verdicts"] == dict.fromkeys(ON_CPU, "in use")


@pytest.fixture
def fresh(monkeypatch):
    """The verdicts and the memo emptied for the test, put back after."""
    monkeypatch.setattr(private, "_verdicts", {})
    monkeypatch.setattr(private, "_memo", {})


def test_a_canary_that_fails_or_raises_falls_back_with_one_log_line(fresh, caplog):
    caplog.set_level(logging.WARNING, logger=private.__name__)
    lying = iter(range(10, 100, 5)).__next__  # a counter that moves by 5 a node
    number = torch._C._autograd._get_sequence_nr()  # (the canary's node's)
    assert private.probe("sequence_nr", lambda: private._node_counter_canary(lying)) is False
    assert private.probe("graph_task", lambda: 1 / 0) is False
    assert private.probe("graph_task", lambda: 1 / 0) is False  # (logged once)
    assert private.verdicts() == {
        "sequence_nr": f"fallback: read 10 then 15 around a new node numbered {number}",
        "graph_task": "fallback: failed (ZeroDivisionError: division by zero)",
    }
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[1] == (
        "instrumented_convs: the backward pass under way (torch._C._current_graph_task_id) "
        f"failed (ZeroDivisionError: division by zero) on torch {torch.__version__}: falling "
        "back (no [backward] rows)"
    )


def test_the_canaries_read_what_they_rely_on(fresh):
    assert private._node_counter_canary(private.find("_C._autograd._get_sequence_nr")) is None
    assert private._graph_task_canary(private.find("_C._current_graph_task_id")) is None
    assert private._graph_task_canary(lambda: 3) == "read 3 outside a backward pass"
    assert private._node_counter_canary(None) == "is missing"
    top = private.find("_C._autograd._top_saved_tensors_default_hooks")
    if top is not None:  # (torch 2.3+)
        assert private.saved_hooks_check(top) is None
    assert private.saved_hooks_check(lambda _: None) == "gave NoneType inside a saved_tensors_hooks"
    assert private.find("_C.no_such_call") is None


def test_a_pass_id_not_read_inside_a_backward_pass_opens_no_backward_step(
    fresh, monkeypatch, caplog
):
    """The pass id's meaning inside a pass is checked where first relied on: the first
    backward step (a backward pass at import would start autograd's device threads)."""
    from instrumented_convs import registry
    from instrumented_convs.core.backward import hooks

    pyg = pytest.importorskip("instrumented_convs.pyg")
    caplog.set_level(logging.WARNING, logger=private.__name__)
    monkeypatch.setattr(hooks, "_task_id", lambda: -1)
    registry.reset()
    conv = pyg.GCNConv(4, 2)
    for _ in range(2):
        conv(torch.randn(5, 4), torch.tensor([[0, 1, 2], [1, 2, 3]])).sum().backward()
    phases = {r.phase for r in registry.summary().rows}
    registry.reset()
    assert phases == {"forward"}
    assert private.verdicts() == {"graph_task": "fallback: read -1 inside a backward pass"}
    assert len(caplog.records) == 1


def test_loader_workers_are_recorded_only_where_torchs_loop_takes_what_ours_wraps(
    fresh, monkeypatch
):
    from instrumented_convs.workers import process

    assert process.recordable() and private.verdicts() == {"worker_loop": "in use"}
    monkeypatch.setattr(process, "_USED", ("worker_id", "index_queue", "results_queue"))
    monkeypatch.setattr(private, "_verdicts", {})
    assert not process.recordable()
    assert private.verdicts() == {"worker_loop": "fallback: takes no results_queue"}
    monkeypatch.setenv(private.ENV, "worker_loop")
    monkeypatch.setattr(process, "_USED", ("worker_id",))
    assert not process.recordable()


def test_the_raw_stream_reader_is_checked_against_torchs_public_stream(monkeypatch):
    class Stream:
        cuda_stream = 0x7F00

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    assert private.raw_stream_check(lambda: 1, lambda d: 0x7F00) is None
    assert private.raw_stream_check(lambda: 0, lambda d: 0x7F00) == (
        "reads device 0 where torch.cuda says 1"
    )
    assert private.raw_stream_check(lambda: 1, lambda d: 0x10) == (
        "reads stream 0x10 where torch.cuda says 0x7f00"
    )


def test_the_compiled_probes_read_false_eagerly_and_true_in_a_trace():
    from torch._guards import TracingContext, tracing

    assert dynamo.compiling() is False and dynamo.inside_compiled() is False
    with tracing(TracingContext(None)):
        assert dynamo.compiling() is True


_runs: Dict[str, Any] = {}
_pool = ThreadPoolExecutor(max_workers=2)


def run_fallbacks(names: str) -> Dict[str, Any]:
    """tests/scripts/fallbacks.py's result with INSTRUMENTED_CONVS_FALLBACK=names (run two at
    a time, each once)."""
    if not _runs:
        for key in ("", "all", *sorted(ON_CPU)):
            _runs[key] = _pool.submit(_run, key)
    return _runs[names].result()


def _run(names: str) -> Dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        proc = run_script(SCRIPT, str(out), env={private.ENV: names, "OMP_NUM_THREADS": "1"})
        result = json.loads(out.read_text())
    result["log"] = [ln for ln in proc.stderr.splitlines() if "falling back" in ln]
    return result


#: What each fallback loses: the backward rows, the labels' fast path (not the labels).
LOSES_BACKWARD = {"sequence_nr", "graph_task", "all"}


@pytest.mark.parametrize("names", ["all", *sorted(ON_CPU)])
def test_each_fallback_forced_gives_the_same_numbers_and_says_so(names):
    pytest.importorskip("torch_geometric")
    plain, forced = run_fallbacks(""), run_fallbacks(names)
    assert forced["ours"] == forced["stock"] == plain["stock"]  # losses and gradients, exactly
    wanted = ON_CPU if names == "all" else {names}
    assert {k for k, v in forced["verdicts"].items() if v.startswith("fallback")} == wanted
    assert len(forced["log"]) == len(wanted)  # one line each
    forward = [r for r in plain["rows"] if r[1] == "forward"]
    if names in LOSES_BACKWARD:  # the forward rows as they were, no backward row
        assert forced["rows"] == forward
        assert not any(label.endswith("[backward]") for label in forced["labels"])
    else:
        assert forced["rows"] == plain["rows"]
        assert forced["labels"] == plain["labels"]
    assert forced["saved_bytes"] == plain["saved_bytes"]
    assert forced["flops"] == plain["flops"]  # (aten's: no torch-sparse op in a GCN)
    assert forced["compiling"] == [False, False]
