"""What the counters and memory recording cost (``configure(counters=True)``,
``configure(memory=True)``: two debugging modes on one dispatch mode).

At the launch-bound proxy of ``launch_bound.py`` (a 3-layer model on a 256-node graph, full
training steps, one thread) and on a bigger graph (``--nodes``): stock, the instrumented
layers with the defaults, the same with the counters on, the same with memory recorded,
and a second stock copy (A/A), interleaved (the order reversed every other round), medians
of per-round ratios. The counters are a dispatch mode and a function mode (for
torch-sparse's and torch-scatter's ops), memory the dispatch mode and a pair of
saved-tensor hooks, each for its own timed block only (they are per thread: nothing else
runs under them). Reported: each variant / stock, and each mode's cost per op it sees
(every op of the epoch: the layers', the loss's and the optimizer's; the counters' with the
function mode's pass-through of every other torch call, memory's with its saved-tensor
hooks and its finalizer per tensor made).

    python benchmarks/counters_cost.py                         # GCNConv, both sizes
    python benchmarks/counters_cost.py --quick                 # a smoke run (CI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import launch_bound as lb  # noqa: E402

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.core.meters import counters as _counters  # noqa: E402

VARIANTS = ("stock", "defaults", "counters", "memory", "stock again")


def measure(label: str, rounds: int, warmup: int) -> Dict[str, Any]:
    """Interleaved epochs of the five variants for one layer at ``lb.NODES`` nodes."""
    _, epochs, _ = lb.variant_models(label, VARIANTS, lambda v: not v.startswith("stock"))

    def counters() -> float:
        with ic.configure(counters=True):
            return lb._timed(epochs["counters"])

    def memory() -> float:
        with ic.configure(memory=True):
            return lb._timed(epochs["memory"])

    variants = {v: (lambda v=v: lb._timed(epochs[v])) for v in VARIANTS}
    variants["counters"], variants["memory"] = counters, memory
    times = lb._interleave(variants, rounds, warmup)
    ic.registry.reset()
    before = _counters.seen
    with ic.configure(counters=True):  # one epoch: how many ops the mode sees
        epochs["counters"]()
    ops = _counters.seen - before
    ic.registry.reset()
    ratio = lambda a, b: statistics.median([p / q for p, q in zip(times[a], times[b])])  # noqa: E731
    diff = lambda a, b: statistics.median([p - q for p, q in zip(times[a], times[b])])  # noqa: E731
    return {
        "median_us": {v: statistics.median(t) for v, t in times.items()},
        "ratio": {v: ratio(v, "stock") for v in VARIANTS[1:]},
        "ops": ops,
        "us_per_op": diff("counters", "defaults") / max(ops, 1),
        "memory_us_per_op": diff("memory", "defaults") / max(ops, 1),
    }


def _measured(label: str, rounds: int, warmup: int) -> Optional[Dict[str, Any]]:
    """:func:`measure`, or None (said) when the layer's framework does not import."""
    try:
        return measure(label, rounds, warmup)
    except ImportError as exc:
        print(f"  {label:16s} skipped: {exc}")
        return None


def main(argv: Optional[List[str]] = None) -> int:
    """Print the table."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layers", nargs="+", default=["PyG GCNConv"], choices=list(lb.LAYERS))
    p.add_argument("--nodes", type=int, nargs="+", default=[256, 16384])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.nodes = 3, 1, [256]
    lb.BLOCK = 4
    torch.set_num_threads(1)
    print(
        f"Counters' and memory's cost: full training steps, 1 thread, medians of {args.rounds} "
        "interleaved "
        f"rounds of {lb.BLOCK} epochs"
    )
    print(
        f"  {'layer':16s} {'nodes':>6s} {'stock us':>9s} {'defaults':>9s} {'counters':>9s} "
        f"{'memory':>9s} {'A/A':>6s} {'ops/epoch':>9s} {'us/op':>6s} {'mem us/op':>9s}"
    )
    for label in args.layers:
        for nodes in args.nodes:
            lb.NODES, lb.EDGES = nodes, 4 * nodes
            r = _measured(label, args.rounds, args.warmup)
            if r is None:  # the framework is not installed here
                continue
            q = r["ratio"]
            print(
                f"  {label:16s} {nodes:6d} {r['median_us']['stock']:9.0f} {q['defaults']:9.3f} "
                f"{q['counters']:9.3f} {q['memory']:9.3f} {q['stock again']:6.3f} "
                f"{r['ops']:9.0f} {r['us_per_op']:6.2f} {r['memory_us_per_op']:9.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
