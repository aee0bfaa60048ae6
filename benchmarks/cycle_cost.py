"""What the duty cycle costs, at the launch-bound proxy, measured in several fresh processes.

The proxy of ``benchmarks/launch_bound.py`` (3 layers of one conv class, 256 nodes, full
training steps, one thread), with only the variants the duty cycle is judged by, so that
more rounds fit: ``stock``, ``defaults`` (everything recorded), ``1 in 10``
(``configure(record_every=10)``), ``budget 1%`` (``configure(budget=0.01)``), ``none drawn``
(one in 10**9: the cycle's hooks and switch alone), ``disabled`` (``configure(enabled=False)``:
the layers' stock path without the cycle) and ``stock again`` (the A/A floor), in
interleaved rounds (the order reversed every other round) of ``--block`` epochs. A shared
2-core VM moves by a few percent between processes, so each layer is measured in
``--processes`` fresh processes, one after another; printed per layer: the median over the
processes of each variant's median ratio to stock, the spread of those (min-max), the
goal of ``1 in 10`` (``defaults``' added time / 10, plus half a point, plus the A/A floor's
distance from 1) and of ``budget 1%`` (1.01 plus the same distance), and the rate the budget
chose in each process.

    python benchmarks/cycle_cost.py                              # the eight layers, 3 processes
    python benchmarks/cycle_cost.py --layers "PyG GCNConv" --processes 5 --rounds 150
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

VARIANTS = ("stock", "defaults", "1 in 10", "budget 1%", "none drawn", "disabled", "stock again")


def one_process(label: str, rounds: int, warmup: int) -> Dict[str, Any]:
    """One process's measurement of one layer: the median ratio of each variant to stock,
    and the rate the budget ended at."""
    _, epochs, _ = lb.variant_models(label, VARIANTS, lambda v: not v.startswith("stock"))

    def cycled(variant: str, **how: Any) -> Any:
        def run() -> float:  # the cycle goes on where it stopped (its draw, its budget)
            with ic.configure(**how):
                return lb._timed(epochs[variant])

        return run

    variants = {
        "stock": lambda: lb._timed(epochs["stock"]),
        "defaults": lambda: lb._timed(epochs["defaults"]),
        "1 in 10": cycled("1 in 10", record_every=10),
        "budget 1%": cycled("budget 1%", budget=0.01),
        "none drawn": cycled("none drawn", record_every=10**9),
        "disabled": cycled("disabled", enabled=False),
        "stock again": lambda: lb._timed(epochs["stock again"]),
    }
    ic.registry.reset()
    times = lb._interleave(variants, rounds, warmup)
    with ic.configure(budget=0.01):
        sampling = ic.registry.summary().sampling
    ratio = {
        v: statistics.median(a / b for a, b in zip(times[v], times["stock"])) for v in VARIANTS[1:]
    }
    return {
        "ratio": ratio,
        "stock_us": statistics.median(times["stock"]),
        "budget_every": sampling["every"],
        "budget_why": sampling["why"],
    }


def goals(ratio: Dict[str, float]) -> Dict[str, float]:
    """The goals of issue 39 for these ratios."""
    floor = abs(ratio["stock again"] - 1)
    return {
        "1 in 10": 1 + (ratio["defaults"] - 1) / 10 + 0.005 + floor,
        "budget 1%": 1.01 + floor,
    }


def main(argv: Optional[List[str]] = None) -> int:
    """Run the processes and print the table (``--child``: one process's JSON)."""
    args = processes.parse(__doc__, lb.LAYERS, argv)
    if args.child:
        return processes.child(args, one_process)
    print(
        f"The duty cycle at the launch-bound proxy (CPU, 1 thread): {args.processes} "
        f"processes a layer, each {args.rounds} interleaved rounds of {args.block} epochs; "
        "median over the processes of each variant's median ratio to stock [min-max]"
    )
    print(
        f"  {'layer':27s} {'stock us':>8s} {'defaults':>16s} {'1 in 10':>16s} {'goal':>6s} "
        f"{'budget 1%':>16s} {'goal':>6s} {'K chosen':>14s} {'none drawn':>16s} "
        f"{'disabled':>16s} {'A/A':>16s}"
    )
    results: Dict[str, Any] = {}
    for label in args.layers:
        runs = processes.runs(__file__, label, args)
        if not runs:
            continue
        med = {v: statistics.median(r["ratio"][v] for r in runs) for v in VARIANTS[1:]}
        span = {
            v: (min(r["ratio"][v] for r in runs), max(r["ratio"][v] for r in runs))
            for v in VARIANTS[1:]
        }
        goal = goals(med)
        results[label] = {"runs": runs, "median": med, "goal": goal}

        def cell(v: str) -> str:
            lo, hi = span[v]
            return f"{med[v]:.3f} [{lo:.3f}-{hi:.3f}]"

        chosen = ",".join(str(r["budget_every"]) for r in runs)
        stock = statistics.median(r["stock_us"] for r in runs)
        print(
            f"  {label:27s} {stock:8.0f} {cell('defaults'):>16s} {cell('1 in 10'):>16s} "
            f"{goal['1 in 10']:6.3f} {cell('budget 1%'):>16s} {goal['budget 1%']:6.3f} "
            f"{chosen:>14s} {cell('none drawn'):>16s} {cell('disabled'):>16s} "
            f"{cell('stock again'):>16s}",
            flush=True,
        )
    processes.write(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
