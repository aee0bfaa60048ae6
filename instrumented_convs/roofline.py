"""The roofline of a run's steps: the machine's limits (:func:`probe`, or figures the user
knows: :func:`given`), a summary's steps read against them, and :func:`plot` drawing them
(matplotlib, the optional extra ``plot``). The counters (``configure(counters=True)``) give
each step its FLOPs and bytes; an example: docs/roofline.md.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

import torch

from .report.roofline import Peak, as_peak, rows_of

__all__ = ["Peak", "probe", "given", "device_of_run", "plot"]


_MB = 1 << 20


def _best(fn: Callable[[], Any], sync: Callable[[], None], repeat: int = 5) -> float:
    fn()  # warm-up
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def _where(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(index)} (cuda:{index})"
    return f"{platform.node()} (cpu, torch threads {torch.get_num_threads()})"


def _cache(folder: Optional[Path], where: str) -> Path:
    base = folder or Path(
        os.environ.get("INSTRUMENTED_CONVS_CACHE", Path.home() / ".cache" / "instrumented_convs")
    )
    key = "".join(c if c.isalnum() or c in "-." else "-" for c in f"{platform.node()}-{where}")
    return base / "probe" / f"{key}.json"


def device_of_run() -> str:
    """The device a finished script ran on, for its probe: ``cuda`` where it initialised
    CUDA (the current device), else ``cpu``."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"


def probe(refresh: bool = False, folder: Optional[Path] = None, device: Any = None) -> Peak:
    """This machine's copy bandwidth and matmul throughput on ``device`` (default the CPU;
    ``"cuda"`` the current GPU): the best of five copies of 128 MB float32 (bytes read +
    written per second) and of five float32 matmuls (1024 x 1024 on the CPU, 4096 x 4096 on
    a GPU, each timed between two synchronizes there). Cached per host, device and thread
    count under ``~/.cache/instrumented_convs/probe/`` (``refresh=True`` measures again);
    its ``source`` says what ran, where and when. It is what this code reaches, below the
    advertised peaks: what ``x roof`` should be read against."""
    dev = torch.device(device or "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("probe(device='cuda'): no CUDA device here")
    where = _where(dev)
    path = _cache(folder, where)
    if not refresh and path.exists():
        data = json.loads(path.read_text())
        return Peak(data["gbs"], data["gflops"], data["source"])
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    src = torch.ones(128 * _MB // 4, device=dev)
    dst = torch.empty_like(src)
    copy_s = _best(lambda: dst.copy_(src), sync)
    n = 4096 if dev.type == "cuda" else 1024
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    mm_s = _best(lambda: a @ b, sync)
    gbs = 2 * src.numel() * 4 / copy_s / 1e9
    gflops = 2 * n**3 / mm_s / 1e9
    source = (
        f"probe on {where}, {time.strftime('%Y-%m-%d')}: copy of 128 MB float32, "
        f"{n}x{n} float32 matmul, best of 5"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"gbs": gbs, "gflops": gflops, "source": source}))
    return Peak(gbs, gflops, source)


def given(
    peak: Optional[Peak], gbs: Optional[float] = None, tflops: Optional[float] = None
) -> Optional[Peak]:
    """``peak`` with the bandwidth (GB/s) and the arithmetic peak (TFLOP/s) the user gave in
    place of its own (either may be None: kept); its source says which figures are given.
    Without ``peak``, both must be given."""
    if gbs is None and tflops is None:
        return peak
    if peak is None and (gbs is None or tflops is None):
        raise ValueError("without a probe, give both the peak GB/s and the peak TFLOP/s")
    parts = [f"{gbs:g} GB/s given"] if gbs is not None else []
    parts += [f"{tflops:g} TFLOP/s given"] if tflops is not None else []
    source = ", ".join(parts) + (
        f"; the rest from the {peak.source}"
        if peak is not None and (gbs is None or tflops is None)
        else ""
    )
    return Peak(
        gbs if gbs is not None else peak.gbs,  # type: ignore[union-attr]
        tflops * 1000 if tflops is not None else peak.gflops,  # type: ignore[union-attr]
        source,
    )


def _leaves(rows: List[Any]) -> List[Any]:
    """The rows with no row below them (rows are in tree order)."""
    return [r for i, r in enumerate(rows) if i + 1 == len(rows) or rows[i + 1].depth <= r.depth]


def plot(
    summary: Any,
    peak: Any,
    path: Optional[str] = None,
    *,
    times: Any = None,
    label: Optional[str] = None,
    ax: Any = None,
    leaves: bool = True,
    names: bool = True,
) -> Any:
    """Each step of ``summary`` as a point on the roofline of ``peak`` (a :class:`Peak`, or a
    ``(GB/s, GFLOP/s)`` pair): its arithmetic intensity (FLOP per byte read and written) and
    its achieved GFLOP/s over its measured time (``times``: a summary of a run without the
    counters, as in ``table(counters=True, times=...)``); forward steps as circles, backward
    ones as triangles, named unless ``names=False``. ``leaves``: only the steps with no step
    below them (a parent's point is the mix of its children's). Steps that did no FLOPs (pure
    gathers and copies) have no place on the log axes: they are left out, and listed in the
    returned axes' ``ic_left_out``. Draws on ``ax`` (a matplotlib Axes: call again to put
    several runs on one plot, each with its ``label``), else on a new figure; saves it to
    ``path`` when given. Returns the Axes."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            f"plot needs matplotlib ({exc}): pip install 'instrumented_convs[plot]'"
        ) from exc
    peak = as_peak(peak)
    rows = rows_of(summary, times)
    if leaves:
        rows = _leaves(rows)
    if ax is None:
        ax = Figure(figsize=(8, 5.5)).subplots()
        ax.ic_left_out = []
    left_out = getattr(ax, "ic_left_out", [])
    shown = []
    for r in rows:
        moved = r.bytes_read + r.bytes_written
        if r.flops and moved and r.total:
            shown.append((r, r.flops / moved, r.flops / r.total / 1e9))
        else:
            left_out.append(r.name + (" [backward]" if r.phase == "backward" else ""))
    ax.ic_left_out = left_out
    colour = None
    for phase, marker in (("forward", "o"), ("backward", "^")):
        pts = [(x, y) for r, x, y in shown if r.phase == phase]
        if pts:
            kw = {"color": colour} if colour is not None else {}
            name = f"{label}, {phase}" if label else phase
            (line,) = ax.plot(*zip(*pts), marker, label=name, alpha=0.8, **kw)
            colour = line.get_color()
    if names:
        for r, x, y in shown:
            mark = " [bw]" if r.phase == "backward" else ""
            ax.annotate(
                r.step + mark, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points"
            )
    _draw_roof(ax, peak, [x for _, x, _ in shown])
    if path is not None:
        ax.figure.savefig(path, dpi=150, bbox_inches="tight")
    return ax


def _draw_roof(ax: Any, peak: Peak, xs: List[float]) -> None:
    """The roof of ``peak`` (bandwidth slope, then the compute ceiling) across the points,
    drawn once per axes (again, wider, when later points need it)."""
    ridge = peak.gflops / peak.gbs
    lo = min([ridge / 100] + [x / 2 for x in xs] + getattr(ax, "ic_span", [])[:1])
    hi = max([ridge * 10] + [x * 2 for x in xs] + getattr(ax, "ic_span", [])[1:])
    old = getattr(ax, "ic_roof", None)
    if old is not None:
        old.remove()
    (ax.ic_roof,) = ax.plot(
        [lo, ridge, hi],
        [lo * peak.gbs, peak.gflops, peak.gflops],
        "-",
        color="0.3",
        linewidth=1,
        zorder=0,
    )
    ax.ic_span = [lo, hi]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte read and written)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"Roof: {peak.gbs:.1f} GB/s, {peak.gflops:.1f} GFLOP/s", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
