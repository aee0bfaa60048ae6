"""The machine's limits for the roofline: a short probe, cached per machine.

:func:`probe` measures, on the CPU, the copy bandwidth (``dst.copy_(src)`` of 128 MB
float32 arrays: bytes read + written per second) and the matmul throughput (``a @ b`` of
two 1024 x 1024 float32 matrices: ``2 n^3`` FLOP per second), the best of five of each at
torch's current number of threads, and caches the result per host and thread count under
``~/.cache/instrumented_convs/probe/`` (``refresh=True`` measures again). Its ``source``
says what ran, when, and on which data. A machine's advertised peaks are higher than what
such a probe reaches; the probe is what this code can reach, which is what ``x roof``
should be read against.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Optional

import torch

from ._roof import Peak

__all__ = ["probe"]

_MB = 1 << 20


def _best(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cache(folder: Optional[Path]) -> Path:
    base = folder or Path(os.environ.get("INSTRUMENTED_CONVS_CACHE", Path.home() / ".cache" /
                                         "instrumented_convs"))  # fmt: skip
    return base / "probe" / f"{platform.node()}-cpu-{torch.get_num_threads()}threads.json"


def probe(refresh: bool = False, folder: Optional[Path] = None) -> Peak:
    """This machine's CPU copy bandwidth and matmul throughput (cached; see the module)."""
    path = _cache(folder)
    if not refresh and path.exists():
        data = json.loads(path.read_text())
        return Peak(data["gbs"], data["gflops"], data["source"])
    src = torch.ones(128 * _MB // 4)
    dst = torch.empty_like(src)
    copy_s = _best(lambda: dst.copy_(src))
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    mm_s = _best(lambda: a @ b)
    gbs = 2 * src.numel() * 4 / copy_s / 1e9
    gflops = 2 * n**3 / mm_s / 1e9
    when = time.strftime("%Y-%m-%d")
    source = (f"probe on {platform.node()}, {when}, torch threads {torch.get_num_threads()}: "
              f"copy of 128 MB float32, {n}x{n} float32 matmul, best of 5")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"gbs": gbs, "gflops": gflops, "source": source}))
    return Peak(gbs, gflops, source)
