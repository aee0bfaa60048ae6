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

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bound as lb  # noqa: E402

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
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layers", nargs="+", default=list(lb.LAYERS), choices=list(lb.LAYERS))
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--quick", action="store_true", help="1 process, 3 rounds: a smoke run")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.processes, args.rounds, args.warmup, args.block = 1, 3, 1, 2
    lb.BLOCK = args.block
    torch.set_num_threads(1)
    if args.child:
        print(json.dumps(one_process(args.layers[0], args.rounds, args.warmup)))
        return 0
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
        runs = []
        for _ in range(args.processes):
            cmd = [sys.executable, "-W", "ignore", __file__, "--child", "--layers", label]
            cmd += ["--rounds", str(args.rounds), "--warmup", str(args.warmup)]
            cmd += ["--block", str(args.block)]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                print(f"  {label:27s} skipped: {proc.stderr.strip().splitlines()[-1][:90]}")
                break
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
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
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
