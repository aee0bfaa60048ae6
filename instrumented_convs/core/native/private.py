"""torch's private calls this package relies on: each looked up once, its meaning checked by a
canary where the package first relies on it, and a fallback (torch's public call, or coarser
timing: never other numbers) taken with one log line where the lookup or the canary fails.

``INSTRUMENTED_CONVS_FALLBACK`` (names of :data:`CALLS`, comma-separated, or ``all``) takes the
fallbacks as if the canaries had failed: the tests and scripts/gpu.sh run them on each torch.
:func:`verdicts` says which are in use (``check``'s environment section).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, Optional

import torch

__all__ = [
    "CALLS",
    "ENV",
    "forced",
    "probe",
    "verdicts",
    "find",
    "sequence_counter",
    "graph_task",
    "task_failed",
    "raw_stream_check",
    "saved_hooks_check",
]

logger = logging.getLogger(__name__)

#: The variable that forces fallbacks (a test's, scripts/gpu.sh's).
ENV = "INSTRUMENTED_CONVS_FALLBACK"

#: Each private call: (what it is, what its fallback gives).
CALLS: Dict[str, tuple] = {
    "sequence_nr": (
        "autograd's node counter (torch._C._autograd._get_sequence_nr)",
        "no [backward] rows",
    ),
    "graph_task": (
        "the backward pass under way (torch._C._current_graph_task_id)",
        "no [backward] rows",
    ),
    "tracing": (
        "Dynamo's tracing context (torch._guards._TLS), read by the compiled-code probe",
        "torch.compiler.is_compiling: Dynamo compiles the frame of a hooked optimizer step",
    ),
    "eval_frame": (
        "Dynamo's frame callback (torch._C._dynamo.eval_frame.get_eval_frame_callback)",
        "a layer called after a graph break in a compiled call records as an eager one",
    ),
    "skip_code": (
        "Dynamo's table of frames not to compile (torch._dynamo.eval_frame.skip_code)",
        "Dynamo may compile a frame of ours called after a graph break",
    ),
    "dispatch": (
        "torch's dispatch modes and op types (torch._ops), read by configure(counters=True)",
        "torch-sparse's and torch-scatter's ops not counted (without dispatch modes: no op)",
    ),
    "saved_hooks": (
        "the saved-tensor hooks set (torch._C._autograd._top_saved_tensors_default_hooks)",
        "configure(memory=True) reads the hooks from autograd's nodes, more slowly",
    ),
    "record_function": (
        "the C++ profiler label (torch._C._profiler._RecordFunctionFast)",
        "torch.profiler.record_function: the same labels, about 5 us more each",
    ),
    "worker_loop": (
        "a DataLoader worker's loop (torch.utils.data._utils.worker._worker_loop)",
        "loader workers not recorded (the loop's waits for batches still are)",
    ),
    "raw_stream": (
        "the current CUDA stream's handle (torch._C._cuda_getCurrentRawStream)",
        "CUDA steps timed with torch.cuda.Event (the Python clock's cost)",
    ),
}

_verdicts: Dict[str, str] = {}
_memo: Dict[str, Any] = {}


def forced(name: str) -> bool:
    """Whether :data:`ENV` asks for ``name``'s fallback."""
    names = {n.strip() for n in os.environ.get(ENV, "").split(",")}
    return "all" in names or name in names


def probe(name: str, canary: Callable[[], Optional[str]]) -> bool:
    """Whether private call ``name`` is used: ``canary()`` returns why it no longer means what
    this package relies on, or None. Never raises; a fallback is logged once."""
    why: Optional[str]
    if forced(name):
        why = f"{ENV} asks for its fallback"
    else:
        try:
            why = canary()
        except Exception as exc:  # noqa: BLE001 - a changed call: its fallback, not a crash
            why = f"failed ({type(exc).__name__}: {exc})"
    if why is None:
        _verdicts.setdefault(name, "in use")
        return True
    if not _verdicts.get(name, "").startswith("fallback"):
        what, instead = CALLS[name]
        logger.warning(
            "instrumented_convs: %s %s on torch %s: falling back (%s)",
            what,
            why,
            torch.__version__,
            instead,
        )
    _verdicts[name] = f"fallback: {why}"
    return False


def verdicts() -> Dict[str, str]:
    """Each private call checked so far: ``"in use"`` or ``"fallback: why"``."""
    return dict(_verdicts)


def find(path: str) -> Any:
    """``torch.<path>`` (dotted), or None where this torch has no such attribute."""
    obj: Any = torch
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _node_counter_canary(fn: Any) -> Optional[str]:
    if fn is None:
        return "is missing"
    if torch.is_inference_mode_enabled():  # (no node can be made: trusted)
        return None
    with torch.enable_grad():
        s0 = fn()
        node = torch.zeros(1, requires_grad=True) * 2
        s1 = fn()
    number = node.grad_fn._sequence_nr()
    if (s1, number) != (s0 + 1, s0):
        return f"read {s0} then {s1} around a new node numbered {number}"
    return None


def sequence_counter() -> Optional[Callable[[], int]]:
    """autograd's per-thread node counter (the number the next node gets), or None where it
    is missing or counts otherwise: the nodes a step made are told apart by it."""
    if "sequence_nr" not in _memo:
        fn = find("_C._autograd._get_sequence_nr")
        ok = probe("sequence_nr", lambda: _node_counter_canary(fn))
        _memo["sequence_nr"] = fn if ok else None
    return _memo["sequence_nr"]


def _graph_task_canary(fn: Any) -> Optional[str]:
    if fn is None:
        return "is missing"
    outside = fn()  # (inside a pass, >= 0: read at the first backward step, task_failed)
    return None if outside == -1 else f"read {outside} outside a backward pass"


def task_failed(task: int) -> None:
    """The first backward step found ``task`` (not a pass's id) inside a backward pass:
    torch's call no longer means what it did. Logged once; the caller opens nothing.
    (Checked there, not at import: a backward pass at import would start autograd's device
    threads, CUDA's included.)"""
    probe("graph_task", lambda: f"read {task} inside a backward pass")


def graph_task() -> Optional[Callable[[], int]]:
    """The id of the backward pass running on this thread (-1: none), or None where it is
    missing or reads otherwise: a step's backward is told apart by it."""
    if "graph_task" not in _memo:
        fn = find("_C._current_graph_task_id")
        ok = probe("graph_task", lambda: _graph_task_canary(fn))
        _memo["graph_task"] = fn if ok else None
    return _memo["graph_task"]


def raw_stream_check(
    get_device: Callable[[], int], raw_stream: Callable[[int], int]
) -> Optional[str]:
    """Why torch's raw readers of the current device and its stream's handle disagree with
    the public ones (``torch.cuda.current_device``, ``Stream.cuda_stream``), or None."""
    device = torch.cuda.current_device()
    if get_device() != device:
        return f"reads device {get_device()} where torch.cuda says {device}"
    public = torch.cuda.current_stream(device).cuda_stream
    if raw_stream(device) != public:
        return f"reads stream {raw_stream(device):#x} where torch.cuda says {public:#x}"
    return None


def saved_hooks_check(top: Any) -> Optional[str]:
    """Why the reader of the saved-tensor hooks set does not give the innermost pair's pack
    function (``torch.autograd.graph.saved_tensors_hooks``), or None."""
    if top is None:
        return "is missing"

    def pack(t: Any) -> Any:
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, pack):
        pair = top(False)
    if not isinstance(pair, tuple) or not pair or pair[0] is not pack:
        return f"gave {type(pair).__name__} inside a saved_tensors_hooks"
    return None
