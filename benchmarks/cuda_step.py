"""Where a step's cost goes on CUDA: its parts one by one, then a profile of training epochs.

A row costs more at the launch-bound proxy on a GPU than on the CPU (docs/performance.md has
the figures). This benchmark times, in ns per call, interleaved round by round (order
reversed every other round), medians of ``--rounds``:

- the CUDA calls a step makes: ``torch.cuda.current_device()``,
  ``torch.cuda.current_stream(0)``, ``torch.cuda.Event(enable_timing=True)`` (a new event),
  ``event.record()`` and ``event.record(stream)``, ``event.query()``;
- whole steps: ``with step(name)`` on the CPU clock, on the CUDA clock, and nested in one;

then runs ``--epochs`` training epochs of the launch-bound proxy's 3-layer PyG GCN
(benchmarks/launch_bound.py), stock and ours with the defaults, under ``cProfile`` and prints
each one's functions with the most own time (``--top``), so the difference shows where the
instrumented epoch spends its extra time. Without CUDA the CUDA parts are skipped.

    python benchmarks/cuda_step.py [--device cuda] [--rounds 7] [--n 20000] [--epochs 200]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import launch_bound as lb  # noqa: E402

from instrumented_convs import registry  # noqa: E402
from instrumented_convs.layers import step  # noqa: E402


def _loop(body: Callable[[], Any], n: int) -> Callable[[], float]:
    def timed() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            body()
        return (time.perf_counter_ns() - t0) / n

    return timed


def parts(device: torch.device, n: int, rounds: int) -> Dict[str, float]:
    """Median ns per call of each part, the bare loop's subtracted."""
    cpu_step = step("bench cpu", device=torch.device("cpu"))

    def with_cpu() -> None:
        with cpu_step:
            pass

    variants: Dict[str, Callable[[], float]] = {
        "bare loop": _loop(lambda: None, n),
        "step, CPU clock": _loop(with_cpu, n),
    }
    if device.type == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        stream = torch.cuda.current_stream(device)
        cuda_step = step("bench cuda", device=device)
        outer = step("bench outer", device=device)

        def with_cuda() -> None:
            with cuda_step:
                pass

        def nested() -> None:
            with cuda_step:
                pass

        variants.update(
            {
                "torch.cuda.current_device()": _loop(torch.cuda.current_device, n),
                "torch.cuda.current_stream(0)": _loop(lambda: torch.cuda.current_stream(0), n),
                "torch.cuda.Event(enable_timing=True)": _loop(
                    lambda: torch.cuda.Event(enable_timing=True), n
                ),
                "event.record()": _loop(ev.record, n),
                "event.record(stream)": _loop(lambda: ev.record(stream), n),
                "event.query()": _loop(ev.query, n),
                "step, CUDA clock": _loop(with_cuda, n),
            }
        )

        def in_outer() -> float:
            with outer:
                return _loop(nested, n)()

        variants["step, CUDA clock, nested"] = in_outer
    names = list(variants)
    times: Dict[str, List[float]] = {v: [] for v in names}
    for r in range(rounds):
        for v in names if r % 2 == 0 else reversed(names):
            times[v].append(variants[v]())
            registry.reset()  # no pending pair outlives a timing
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    bare = statistics.median(times["bare loop"])
    return {v: statistics.median(t) - (0 if v == "bare loop" else bare) for v, t in times.items()}


def profile_epochs(device: torch.device, epochs: int, top: int) -> Dict[str, str]:
    """cProfile of ``epochs`` launch-bound training epochs, stock and ours: the top lines."""
    lb.DEVICE, lb.BLOCK = device, epochs
    _, runs, _ = lb.variant_models("PyG GCNConv", ("stock", "defaults"), lambda v: v != "stock")
    out = {}
    for v in ("stock", "defaults"):
        lb._timed(runs[v])  # warm-up
        prof = cProfile.Profile()
        prof.enable()
        us = lb._timed(runs[v])
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        out[v] = f"{v}: {us:.0f} us an epoch under cProfile\n" + buf.getvalue()
        registry.reset()
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """Print both tables (and write JSON with --json)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--n", type=int, default=20_000, help="calls per timing")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--epochs", type=int, default=200, help="epochs profiled per variant")
    p.add_argument("--top", type=int, default=25, help="functions listed per profile")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    device = lb.device_of(args.device)
    if device is None:
        return 2
    torch.set_num_threads(1)
    if device.type == "cuda":
        torch.zeros(1, device=device)  # CUDA initialised: steps without a device use events
    got = parts(device, args.n, args.rounds)
    print(
        f"Parts of a step on {device}, ns a call (medians of {args.rounds} rounds, "
        f"{args.n} calls each, the bare loop subtracted)"
    )
    for k, v in got.items():
        print(f"  {k:40s} {v:10.0f}")
    profiles = profile_epochs(device, args.epochs, args.top)
    for text in profiles.values():
        print(text)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": str(device), "parts_ns": got, "profiles": profiles}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
