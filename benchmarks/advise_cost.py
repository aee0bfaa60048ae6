"""What noting the advice's signals costs (``configure(advise=True)``): each call of a layer
the rules know (GCNConv, APPNP, GCN2Conv; DGL's GraphConv) notes its graph (a weak
reference, the storage, version and shape of its tensors, compared with the last call's).

At the launch-bound proxy of ``launch_bound.py`` (a 3-layer model on a 256-node graph, full
training steps, one thread), where every microsecond per call shows: stock, the instrumented
layers with the defaults, the same with ``advise=True``, and a second stock copy (A/A),
interleaved (the order reversed every other round), medians of per-round ratios; the cost per
layer call is (advise - defaults) / the layer calls of an epoch.

    python benchmarks/advise_cost.py                     # GCNConv and DGL GraphConv
    python benchmarks/advise_cost.py --quick             # a smoke run
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

VARIANTS = ("stock", "defaults", "advise", "stock again")
#: The layer calls of one epoch at the proxy: 3 layers, one forward each.
CALLS = 3


def measure(label: str, rounds: int, warmup: int) -> Dict[str, Any]:
    """Interleaved epochs of the four variants for one layer."""
    _, epochs, _ = lb.variant_models(label, VARIANTS, lambda v: not v.startswith("stock"))

    def advise() -> float:
        with ic.configure(advise=True):
            return lb._timed(epochs["advise"])

    variants = {v: (lambda v=v: lb._timed(epochs[v])) for v in VARIANTS}
    variants["advise"] = advise
    times = lb._interleave(variants, rounds, warmup)
    ic.registry.reset()
    ratio = lambda a, b: statistics.median([p / q for p, q in zip(times[a], times[b])])  # noqa: E731
    diff = lambda a, b: statistics.median([p - q for p, q in zip(times[a], times[b])])  # noqa: E731
    return {
        "median_us": {v: statistics.median(t) for v, t in times.items()},
        "ratio": {v: ratio(v, "stock") for v in VARIANTS[1:]},
        "advise_vs_defaults": ratio("advise", "defaults"),
        "us_per_call": diff("advise", "defaults") / CALLS,
    }


def main(argv: Optional[List[str]] = None) -> int:
    """Print the table."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--layers", nargs="+", default=["PyG GCNConv", "DGL GraphConv"], choices=list(lb.LAYERS)
    )
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup = 3, 1
    lb.BLOCK = 4
    torch.set_num_threads(1)
    print(
        f"The advice's signals: full training steps, 1 thread, medians of {args.rounds} "
        f"interleaved rounds of {lb.BLOCK} epochs (times per epoch)"
    )
    print(
        f"  {'layer':16s} {'stock us':>9s} {'defaults':>9s} {'advise':>9s} {'A/A':>6s} "
        f"{'advise/defaults':>15s} {'us/call':>8s}"
    )
    for label in args.layers:
        try:
            r = measure(label, args.rounds, args.warmup)
        except ImportError as exc:
            print(f"  {label:16s} skipped: {exc}")
            continue
        q = r["ratio"]
        print(
            f"  {label:16s} {r['median_us']['stock']:9.0f} {q['defaults']:9.3f} "
            f"{q['advise']:9.3f} {q['stock again']:6.3f} {r['advise_vs_defaults']:15.3f} "
            f"{r['us_per_call']:8.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
