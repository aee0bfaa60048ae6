"""What ``python -m instrumented_convs run`` adds to a launch-bound epoch, beyond the layers.

``run`` instruments the layers (the cost ``launch_bound.py`` measures) and also hooks the
training loop: every module call goes through a wrapper (one thread-local read for nested
calls), and the outermost call, ``backward`` and ``optimizer.step`` are regions. Its hooks
are process-wide, so the variant under them installs them for its own timed block only.
Same model, data and epoch as ``launch_bound.py`` (a 3-layer model on 256 nodes, full
training steps, one thread); variants interleaved, the order reversed every other round:

- ``stock``: the framework's layers, no hooks;
- ``ours``: the instrumented layers, no hooks (what an import change gives);
- ``under run``: a stock copy under ``run``'s hooks (instrumented by them at its first call);
- ``stock again``: the A/A noise floor.

Reported per layer: ratios to stock, and the hooks' own cost: (under run - ours) per epoch,
and that spread over the epoch's module calls and its three regions (an average of both kinds:
a region costs more than a nested call).

    python benchmarks/run_cost.py                      # PyG GCNConv and DGL GraphConv
    python benchmarks/run_cost.py --layers "PyG GATConv" --rounds 50
    python benchmarks/run_cost.py --quick              # a smoke run (CI)
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
from instrumented_convs.launch.hooks import Hooks  # noqa: E402

VARIANTS = ("stock", "ours", "under run", "stock again")


def _module_calls(model: torch.nn.Module, epoch: Any) -> int:
    """Module calls one epoch makes (the wrapper's calls)."""
    n = [0]

    def count(*_: Any) -> None:
        n[0] += 1

    handles = [m.register_forward_pre_hook(count) for m in model.modules()]
    try:
        epoch()
    finally:
        for h in handles:
            h.remove()
    return n[0]


def measure(label: str, rounds: int, warmup: int) -> Dict[str, Any]:
    """Interleaved epochs of the four variants for one layer."""
    models, epochs, _ = lb.variant_models(label, VARIANTS, lambda v: v == "ours")
    calls = _module_calls(models["under run"], epochs["under run"])
    hooks = Hooks()

    def under_run() -> float:
        hooks.install()
        try:
            return lb._timed(epochs["under run"])
        finally:
            hooks.close()
            hooks.remove()

    variants = {v: (lambda v=v: lb._timed(epochs[v])) for v in VARIANTS}
    variants["under run"] = under_run
    times = lb._interleave(variants, rounds, warmup)
    ic.registry.reset()
    ratio = lambda a, b: statistics.median([p / q for p, q in zip(times[a], times[b])])  # noqa: E731
    diff = lambda a, b: statistics.median([p - q for p, q in zip(times[a], times[b])])  # noqa: E731
    hooks_us = diff("under run", "ours")
    regions = 3  # forward, backward, optimizer.step
    return {
        "rounds": rounds,
        "median_us": {v: statistics.median(t) for v, t in times.items()},
        "ratio": {v: ratio(v, "stock") for v in VARIANTS[1:]},
        "hooks_us_per_epoch": hooks_us,
        "module_calls": calls,
        "hooks_us_per_call_and_region": hooks_us / (calls + regions),
    }


def main(argv: Optional[List[str]] = None) -> int:
    """Print the table."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--layers",
        nargs="+",
        default=["PyG GCNConv", "DGL GraphConv"],
        choices=list(lb.LAYERS),
        metavar="LAYER",
    )
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--block", type=int, default=16, help="epochs per timing")
    p.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.block = 3, 1, 2
    lb.BLOCK = args.block
    torch.set_num_threads(1)
    print(
        f"run's hooks at the launch-bound proxy ({lb.NODES} nodes, full training steps, "
        f"1 thread): medians of {args.rounds} interleaved rounds of {lb.BLOCK} epochs"
    )
    print(
        f"  {'layer':16s} {'stock us':>9s} {'ours':>7s} {'under run':>9s} {'A/A':>6s} "
        f"{'hooks us':>9s} {'calls':>6s} {'us/(call+region)':>16s}"
    )
    for label in args.layers:
        try:
            r = measure(label, args.rounds, args.warmup)
        except ImportError as exc:
            print(f"  {label:16s} skipped: {exc}")
            continue
        q = r["ratio"]
        print(
            f"  {label:16s} {r['median_us']['stock']:9.0f} {q['ours']:7.3f} "
            f"{q['under run']:9.3f} {q['stock again']:6.3f} {r['hooks_us_per_epoch']:9.1f} "
            f"{r['module_calls']:6d} {r['hooks_us_per_call_and_region']:16.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
