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
import json
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

    def switched(v: str, on: bool) -> Any:
        def run() -> float:  # both pay configure's enter and exit alike, outside the timing
            with ic.configure(advise=on):
                return lb._timed(epochs[v])

        return run

    variants = {v: (lambda v=v: lb._timed(epochs[v])) for v in VARIANTS}
    variants["defaults"], variants["advise"] = switched("defaults", False), switched("advise", True)
    times = lb._interleave(variants, rounds, warmup)
    ic.registry.reset()

    def ratios(a: str, b: str) -> List[float]:
        return [p / q for p, q in zip(times[a], times[b])]

    def spread(values: List[float]) -> List[float]:
        """The first and third quartiles."""
        q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        return [q[0], q[-1]]

    diff = statistics.median([p - q for p, q in zip(times["advise"], times["defaults"])])
    return {
        "median_us": {v: statistics.median(t) for v, t in times.items()},
        "ratio": {v: statistics.median(ratios(v, "stock")) for v in VARIANTS[1:]},
        "aa_quartiles": spread(ratios("stock again", "stock")),
        "advise_vs_defaults": statistics.median(ratios("advise", "defaults")),
        "advise_vs_defaults_quartiles": spread(ratios("advise", "defaults")),
        "us_per_call": diff / CALLS,
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
    p.add_argument("--json", help="also write the figures to this file")
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
        f"{'A/A quartiles':>13s} {'advise/defaults':>15s} {'its quartiles':>13s} {'us/call':>8s}"
    )
    out: Dict[str, Any] = {}
    for label in args.layers:
        try:
            r = out[label] = measure(label, args.rounds, args.warmup)
        except ImportError as exc:
            print(f"  {label:16s} skipped: {exc}")
            continue
        q, aa, ad = r["ratio"], r["aa_quartiles"], r["advise_vs_defaults_quartiles"]
        print(
            f"  {label:16s} {r['median_us']['stock']:9.0f} {q['defaults']:9.3f} "
            f"{q['advise']:9.3f} {q['stock again']:6.3f} {aa[0]:6.3f}-{aa[1]:.3f} "
            f"{r['advise_vs_defaults']:15.3f} {ad[0]:6.3f}-{ad[1]:.3f} {r['us_per_call']:8.2f}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
