"""What ``run --autosave`` costs the training loop: the launch-bound proxy of
``benchmarks/launch_bound.py`` (3 layers of one conv class, 256 nodes, full training steps, one
thread), ours as ``run`` has it (the timeline on), with and without the autosave's thread.

Variants, in interleaved rounds (the order reversed every other round), each round
``--seconds`` of back-to-back epochs, every epoch timed on its own:

- ``ours``: no autosave (each block on a new timeline, as ``run`` records one);
- ``autosave``: the autosave's thread started at the block's start, every ``--every`` seconds
  (default 0.5: 120 times run's default of 60, so that its cost is large enough to read) making
  the record as ``run`` does (the registry's snapshot, the run's record, its JSON) and writing
  it whole in a temporary folder;
- ``ours again``: the A/A floor.

Reported per layer: the median over rounds of each variant's mean epoch over ``ours``'s (the
time the loop lost, autosaves included), the longest epoch of each variant (the loop's
longest stall), what one autosave took on its thread (median and longest) and the record's
size; the cost at run's default interval is the loss scaled by ``--every`` / 60.

    python benchmarks/autosave_cost.py                       # PyG GCNConv and GATConv
    python benchmarks/autosave_cost.py --layers "PyG GCNConv" --rounds 20 --every 0.2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bound as lb  # noqa: E402

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.commands.launch.autosave import Autosave, autosave_record  # noqa: E402
from instrumented_convs.commands.launch.runs import TRACE_LIMIT, run_meta  # noqa: E402

VARIANTS = ("ours", "autosave", "ours again")


def _maker(folder: Path, started: float) -> Tuple[Callable[[int], Tuple[Path, str]], List[int]]:
    """The record ``run`` would autosave (no hooks: a script's own layers), and its sizes."""
    sizes: List[int] = []

    def make(number: int) -> Tuple[Path, str]:
        meta = run_meta(["autosave_cost"], "autosave_cost.py", [], started, "running", None)
        meta.update(exit_code=None, autosave={"saved": time.time(), "number": number})
        path, text = autosave_record(folder, ic.registry.snapshot(), meta)
        sizes.append(len(text))
        return path, text

    return make, sizes


def _block(epoch: Callable[[], None], seconds: float) -> List[float]:
    """Each epoch's microseconds, back to back for ``seconds``."""
    times: List[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter_ns()
        epoch()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return times


def measure(label: str, rounds: int, seconds: float, every: float) -> Dict[str, Any]:
    """One layer's variants (see the module docstring)."""
    _, epochs, _ = lb.variant_models(label, VARIANTS, lambda v: True)
    folder = Path(tempfile.mkdtemp(prefix="autosave-cost-"))
    make, sizes = _maker(folder, time.time())
    took: List[float] = []
    for v in VARIANTS:  # warm-up
        _block(epochs[v], 0.2)
    means: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    longest = {v: 0.0 for v in VARIANTS}
    every_epoch: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    saves = 0
    for r in range(rounds):
        for v in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
            auto = Autosave(every, make) if v == "autosave" else None
            with ic.configure(timeline=TRACE_LIMIT):  # (a new one: never at its limit)
                if auto is not None:
                    auto.start()
                times = _block(epochs[v], seconds)
                if auto is not None:
                    auto.stop()
                    saves += auto.saves
                    took.append(auto.longest_s)
            means[v].append(statistics.fmean(times))
            every_epoch[v] += times
            longest[v] = max(longest[v], max(times))
    ratio = {v: statistics.median(m / s for m, s in zip(means[v], means["ours"])) for v in VARIANTS}
    return {
        "ratio": ratio,
        "epoch_us": {v: statistics.median(means[v]) for v in VARIANTS},
        "longest_epoch_us": longest,
        "p999_epoch_us": {v: statistics.quantiles(every_epoch[v], n=1000)[-1] for v in VARIANTS},
        "autosaves": saves,
        "autosave_longest_ms": 1e3 * max(took, default=0.0),
        "record_bytes": statistics.median(sizes) if sizes else 0,
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="PyG GCNConv,PyG GATConv")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--every", type=float, default=0.5)
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true", help="a smoke run (CI)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds, args.every = 2, 0.3, 0.1
    import torch

    torch.set_num_threads(1)
    results = {}
    for label in args.layers.split(","):
        r = results[label] = measure(label, args.rounds, args.seconds, args.every)
        at_default = (r["ratio"]["autosave"] - 1) * args.every / 60
        aa = r["ratio"]["ours again"] - 1
        print(
            f"{label}: autosave every {args.every:g} s {r['ratio']['autosave']:.4f} of ours "
            f"(A/A {1 + aa:.4f}; at 60 s: {100 * at_default:+.3f}%), {r['autosaves']} autosaves "
            f"of {r['record_bytes'] / 1e3:.0f} kB, the longest {r['autosave_longest_ms']:.1f} ms;"
            f" the longest epoch {r['longest_epoch_us']['autosave']:.0f} us with it, "
            f"{r['longest_epoch_us']['ours']:.0f} and {r['longest_epoch_us']['ours again']:.0f}"
            f" without; the 99.9th percentile {r['p999_epoch_us']['autosave']:.0f} us with it, "
            f"{r['p999_epoch_us']['ours']:.0f} and {r['p999_epoch_us']['ours again']:.0f} without"
            f" (median epoch {r['epoch_us']['ours']:.0f} us)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
