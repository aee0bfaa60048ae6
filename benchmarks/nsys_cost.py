"""What the ranges mode costs (``configure(record="ranges")``, ``run --record ranges``): the
way to profile under Nsight Systems, at the launch-bound proxy of ``launch_bound.py``.

Variants of one layer's 3-layer model (256 nodes, full training steps, one thread), timed in
interleaved rounds (the order reversed every other round) of ``--block`` epochs, in
``--processes`` fresh processes: ``stock``; ``defaults`` (NVTX off: no tool attached);
``defaults + ranges`` (``nvtx="nvtx"``: every step's range pushed and its time recorded, what
a run under nsys does by default, a layer's backward timed one call in 16); ``every call +
ranges`` (the same with every call's backward, ``backward_every=1``: the ranges the ranges
mode pushes, and every time recorded); ``ranges`` (``record="ranges"``, ``nvtx="nvtx"``:
ranges only, every call's backward included); ``ranges 1 in 16`` (the ranges mode with
``backward_every=16``: the backward's ranges of one call in 16); ``disabled``; ``stock
again`` (the A/A floor). The
``nvtx`` package is forced on without a tool attached, so a push is its call into NVTX's
no-op: under nsys each range also costs what nsys takes to record it.

Printed per layer: the median over the processes of each variant's median ratio to stock
[min-max], the ranges an epoch pushes in the ranges mode, and what each costs in µs.

    python benchmarks/nsys_cost.py                                # the four PyG layers
    python benchmarks/nsys_cost.py --layers "PyG GCNConv" --processes 5 --rounds 150
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bound as lb  # noqa: E402
import processes  # noqa: E402

import instrumented_convs as ic  # noqa: E402

VARIANTS = (
    "stock",
    "defaults",
    "defaults + ranges",
    "every call + ranges",
    "ranges",
    "ranges 1 in 16",
    "disabled",
    "stock again",
)
#: The switches of each variant that is not stock (configure's arguments).
HOW: Dict[str, Dict[str, Any]] = {
    "defaults": {},
    "defaults + ranges": {"nvtx": "nvtx"},
    "every call + ranges": {"nvtx": "nvtx", "backward_every": 1},
    "ranges": {"nvtx": "nvtx", "record": "ranges"},
    "ranges 1 in 16": {"nvtx": "nvtx", "record": "ranges", "backward_every": 16},
    "disabled": {"enabled": False},
}
PYG = ("PyG GCNConv", "PyG SAGEConv", "PyG GATConv", "PyG GINConv")


def one_process(label: str, rounds: int, warmup: int) -> Dict[str, Any]:
    """One process's ratios to stock for one layer, and the ranges an epoch pushes."""
    _, epochs, _ = lb.variant_models(label, VARIANTS, lambda v: not v.startswith("stock"))
    with ic.configure(nvtx="nvtx"):
        if ic.configure().nvtx != "nvtx":
            raise SystemExit("the nvtx package is not installed: pip install nvtx")

    def timed(variant: str) -> Any:
        def run() -> float:
            with ic.configure(**HOW.get(variant, {})):
                return lb._timed(epochs[variant])

        return run

    ic.registry.reset()
    times = lb._interleave({v: timed(v) for v in VARIANTS}, rounds, warmup)
    with ic.configure(backward_every=1):  # what the ranges mode pushes: every call's rows
        fwd, bwd = lb._rows_per_epoch(epochs["defaults"])
    ratio = {
        v: statistics.median(a / b for a, b in zip(times[v], times["stock"])) for v in VARIANTS[1:]
    }
    stock = statistics.median(times["stock"])
    return {"ratio": ratio, "stock_us": stock, "ranges": fwd + bwd}


def main(argv: Optional[List[str]] = None) -> int:
    """Run the processes and print the table (``--child``: one process's JSON)."""
    args = processes.parse(__doc__, PYG, argv)
    if args.child:
        return processes.child(args, one_process)
    print(
        f"The ranges mode at the launch-bound proxy (CPU, 1 thread): {args.processes} "
        f"processes a layer, each {args.rounds} interleaved rounds of {args.block} epochs; "
        "median over the processes of each variant's median ratio to stock [min-max]"
    )
    results: Dict[str, Any] = {}
    for label in args.layers:
        runs = processes.runs(__file__, label, args)
        if not runs:
            continue
        med = {v: statistics.median(r["ratio"][v] for r in runs) for v in VARIANTS[1:]}
        stock = statistics.median(r["stock_us"] for r in runs)
        ranges = runs[0]["ranges"]
        per_range = (med["ranges"] - 1) * stock / ranges if ranges else 0.0
        results[label] = {"runs": runs, "median": med, "ranges": ranges, "us_a_range": per_range}
        cells = "  ".join(
            f"{v} {med[v]:.3f} [{min(r['ratio'][v] for r in runs):.3f}-"
            f"{max(r['ratio'][v] for r in runs):.3f}]"
            for v in VARIANTS[1:]
        )
        print(
            f"  {label:14s} stock {stock:6.0f} us  {cells}  ranges/epoch {ranges}, "
            f"{per_range:.2f} us a range",
            flush=True,
        )
    processes.write(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
