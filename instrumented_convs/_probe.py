"""The machine's limits for the roofline: a short probe, cached per machine and device.

:func:`probe` measures, on a device (the CPU, or a CUDA device), the copy bandwidth
(``dst.copy_(src)`` of 128 MB float32 arrays: bytes read + written per second) and the
matmul throughput (``a @ b`` of two float32 matrices, 1024 x 1024 on the CPU, 4096 x 4096
on a GPU: ``2 n^3`` FLOP per second), the best of five of each (on CUDA, each timed between
two ``torch.cuda.synchronize()``: the probe's own, never a step's), and caches the result
per host, device and thread count under ``~/.cache/instrumented_convs/probe/``
(``refresh=True`` measures again). Its ``source`` says what ran, where (the host and its
torch threads, or the GPU's name and index), when, and on which data. A GPU run must be read
against a GPU probe: ``run`` probes the device the script used. A machine's advertised
peaks are higher than what such a probe reaches; the probe is what this code can reach,
which is what ``x roof`` should be read against. :func:`given` replaces either figure with
one the user knows (``run --peak-gbs``/``--peak-tflops``), and says so in the source.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ._roof import Peak

__all__ = ["probe", "given", "device_of_run"]

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
    base = folder or Path(os.environ.get("INSTRUMENTED_CONVS_CACHE", Path.home() / ".cache" /
                                         "instrumented_convs"))  # fmt: skip
    key = "".join(c if c.isalnum() or c in "-." else "-" for c in f"{platform.node()}-{where}")
    return base / "probe" / f"{key}.json"


def device_of_run() -> str:
    """The device a finished script ran on, for its probe: ``cuda`` where it initialised
    CUDA (the current device), else ``cpu``."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"


def probe(refresh: bool = False, folder: Optional[Path] = None, device: Any = None) -> Peak:
    """This machine's copy bandwidth and matmul throughput on ``device`` (default the CPU;
    ``"cuda"`` the current GPU), cached; see the module."""
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
    source = (f"probe on {where}, {time.strftime('%Y-%m-%d')}: copy of 128 MB float32, "
              f"{n}x{n} float32 matmul, best of 5")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"gbs": gbs, "gflops": gflops, "source": source}))
    return Peak(gbs, gflops, source)


def given(peak: Optional[Peak], gbs: Optional[float] = None,
          tflops: Optional[float] = None) -> Optional[Peak]:  # fmt: skip
    """``peak`` with the bandwidth (GB/s) and the arithmetic peak (TFLOP/s) the user gave in
    place of its own (either may be None: kept); its source says which figures are given.
    Without ``peak``, both must be given."""
    if gbs is None and tflops is None:
        return peak
    if peak is None and (gbs is None or tflops is None):
        raise ValueError("without a probe, give both the peak GB/s and the peak TFLOP/s")
    parts = [f"{gbs:g} GB/s given"] if gbs is not None else []
    parts += [f"{tflops:g} TFLOP/s given"] if tflops is not None else []
    source = ", ".join(parts) + (f"; the rest from the {peak.source}" if peak is not None and (
        gbs is None or tflops is None) else "")  # fmt: skip
    return Peak(
        gbs if gbs is not None else peak.gbs,  # type: ignore[union-attr]
        tflops * 1000 if tflops is not None else peak.gflops,  # type: ignore[union-attr]
        source,
    )
