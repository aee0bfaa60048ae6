"""Section 3 on a CUDA device: the tool adds no synchronisation, and its CUDA timing holds,
since a profiler that synchronises changes the times it reads. Each check returns
``(status, detail, figures)``; the GPU tests of tests/ call them too.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ... import region, registry
from ...layers import mark_outputs, step
from ...testing import depth
from ._report import FAIL, PASS

__all__ = [
    "count_syncs",
    "syncs_added",
    "events_without_sync",
    "graph_capture",
    "backward_thread",
    "epochs",
]

Verdict = Tuple[str, str, Dict[str, Any]]
#: The text of the sync debug mode's warning (c10's ``warn_or_error_on_sync``). Not a bare
#: "synchroniz": torch's notice, once a process, that the mode "does not yet detect all
#: synchronizing operations" is no synchronisation (it failed a first test on an H100).
SYNC_WARNING = "called a synchronizing CUDA operation"


def count_syncs(fn: Callable[[], Any]) -> int:
    """How many synchronising CUDA calls ``fn()`` makes: the warnings of
    ``torch.cuda.set_sync_debug_mode("warn")``, and the calls of ``torch.cuda.synchronize``."""
    calls = []
    real = torch.cuda.synchronize

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        torch.cuda.synchronize = counted  # type: ignore[assignment]
        try:
            fn()
        finally:
            torch.cuda.synchronize = real  # type: ignore[assignment]
            torch.cuda.set_sync_debug_mode(before)
    return len(calls) + sum(SYNC_WARNING in str(w.message) for w in caught)


def syncs_added(stock: Callable[[], Any], ours: Callable[[], Any]) -> Verdict:
    """Whether ``ours`` (an epoch) synchronises more often than ``stock`` (the same epoch)."""
    s, o = count_syncs(stock), count_syncs(ours)
    data = {"stock": s, "ours": o}
    if o > s:
        return FAIL, f"{o} synchronising CUDA calls, stock {s}: the tool added {o - s}", data
    return PASS, f"{o} synchronising CUDA calls, as stock ({s})", data


def events_without_sync(device: torch.device, place: Optional[torch.device] = None) -> Verdict:
    """A step around a matmul, five times: timed by CUDA events, resolved when read.
    (``place``: where the matmul's tensors live, ``device`` by default: the CPU in tests,
    where fake events stand in for CUDA's.)"""
    x = torch.randn(2048, 2048, device=place or device)
    x @ x
    torch.cuda.synchronize(device)
    registry.reset()
    box: Dict[str, Any] = {}

    def run() -> None:
        for _ in range(5):
            with step("check: matmul", device=device):
                x @ x
        box["pending"] = len(registry.pending)

    syncs = count_syncs(run)
    row = registry.summary()["check: matmul"]
    data = {"syncs": syncs, "pending": box["pending"], "count": row.count, "mean_s": row.mean}
    registry.reset()
    if syncs or box["pending"] == 0 or row.count != 5 or not row.min > 0:
        return (
            FAIL,
            f"synchronised {syncs}x, {box['pending']} pairs pending, {row.count} timed",
            data,
        )
    return PASS, f"5 calls timed by events ({row.mean * 1e6:.1f} us each), no synchronisation", data


def graph_capture(device: torch.device) -> Verdict:
    """A step inside a CUDA graph capture: counted, not timed; the graph still replays."""
    x = torch.randn(64, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        x * 2
    torch.cuda.current_stream(device).wait_stream(side)
    registry.reset()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        with step("check: in graph", device=device):
            y = x * 2
    g.replay()
    torch.cuda.synchronize(device)
    r = registry.summary()["check: in graph"]
    registry.reset()
    ok = r.untimed == 1 and r.count == 0 and torch.allclose(y, x * 2)
    data = {"untimed": r.untimed, "count": r.count}
    return (
        (PASS, "counted as untimed, the graph replays", data)
        if ok
        else (FAIL, f"untimed {r.untimed}, timed {r.count}", data)
    )


def backward_thread(device: torch.device) -> Verdict:
    """Backward rows (run on autograd's device thread) nest under the caller's region."""
    x = torch.randn(4096, 256, device=device)
    w = torch.randn(256, 256, device=device, requires_grad=True)

    def block(h: torch.Tensor) -> torch.Tensor:
        with step("check: block"):
            with step("matmul"):
                h = h @ w
            return mark_outputs(h.relu())

    block(x).sum().backward()  # warm-up: the device thread starts
    torch.cuda.synchronize(device)
    registry.reset()

    def run() -> None:
        for _ in range(5):
            with region("check: forward"):
                loss = block(x).sum()
            with region("check: backward"):
                loss.backward()

    syncs = count_syncs(run)
    rows = [(r.name, r.count) for r in registry.summary().rows if r.phase == "backward"]
    registry.reset()
    want = [("check: backward/check: block", 5), ("check: backward/check: block/matmul", 5)]
    data = {"syncs": syncs, "rows": rows}
    if syncs or rows != want or depth():
        return FAIL, f"backward rows {rows}, synchronised {syncs}x", data
    return PASS, "5 backward calls under the caller's region, no synchronisation", data


def epochs(platform: str, shape: str, device: torch.device) -> Tuple[Callable, Callable]:
    """One training epoch of the study's GCN, stock and ours (same weights), on ``device``."""
    from ..study.bench import training_epoch
    from ..study.data import SHAPES, synthetic_graph
    from ..study.models import build_model

    data = synthetic_graph(shape, **SHAPES[shape]).to(device)
    torch.manual_seed(0)
    ours, graph = build_model(platform, data, hidden=64)
    stock, _ = build_model(platform, data, hidden=64, stock=True)
    stock.load_state_dict(ours.state_dict())
    if platform == "dgl":
        graph = graph.to(device)
    stock, ours = stock.to(device), ours.to(device)
    return training_epoch(stock, graph, data), training_epoch(ours, graph, data)


def section(device: torch.device, quick: bool, progress: Any = None) -> Any:
    """Section 3: skipped without CUDA; else the epochs' synchronisations and the checks
    above, a line each.

    - A training epoch of the study's GCN, stock and ours, under
      ``torch.cuda.set_sync_debug_mode("warn")`` (which warns at every synchronising CUDA call:
      a copy to the host, ``.item()``, ``nonzero``...) with ``torch.cuda.synchronize`` counted
      too: ours must make exactly as many as stock (:func:`count_syncs`).
    - A step around a matmul times it with CUDA events, no ``synchronize``, resolved lazily
      (:func:`events_without_sync`); a step inside a CUDA graph capture is counted, not timed
      (:func:`graph_capture`); backward rows, whose nodes autograd runs on its device thread,
      nest under the caller's region, timed with events, no ``synchronize``
      (:func:`backward_thread`). These are the GPU tests of tests/ (they call these functions).

    Each returns ``(status, detail, figures)``; on a machine without CUDA the section is
    skipped.
    """
    from ._report import SKIPPED, Section

    s = Section("3. No added synchronisation (CUDA)", ABOUT)
    if device.type != "cuda":
        s.add("synchronising calls", SKIPPED, f"the device is {device}: nothing to synchronise")
        return s
    for platform in ("pyg", "dgl"):
        name = f"{'PyG' if platform == 'pyg' else 'DGL'} GCN epoch, Cora's shape"
        if progress is not None:
            progress(f"synchronisation: {name}")
        try:
            stock, ours = epochs(platform, "synthetic-cora", device)
            stock(), ours()  # warm-up
            status, detail, data = syncs_added(stock, ours)
        except ImportError as exc:
            status, detail, data = SKIPPED, f"needs {exc.name or exc}: not installed", {}
        except Exception as exc:  # a DGL build without CUDA
            status = SKIPPED if platform == "dgl" else FAIL
            detail, data = f"raised {type(exc).__name__}: {exc}", {}
        s.add(name, status, detail, **data)
    for name, check in (
        ("a step's CUDA events", events_without_sync),
        ("a step in a CUDA graph capture", graph_capture),
        ("backward rows on the device thread", backward_thread),
    ):
        if progress is not None:
            progress(f"synchronisation: {name}")
        try:
            status, detail, data = check(device)
        except Exception as exc:
            status, detail, data = FAIL, f"raised {type(exc).__name__}: {exc}", {}
        s.add(name, status, detail, **data)
    return s


ABOUT = (
    "A training epoch, stock and ours, under torch.cuda.set_sync_debug_mode('warn') with "
    "torch.cuda.synchronize counted: ours makes no synchronising call that stock does not; a "
    "step's CUDA events are resolved lazily; a step in a CUDA graph capture is not timed; "
    "backward rows from autograd's device thread nest under the caller's region."
)
