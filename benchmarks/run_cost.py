"""What ``python -m instrumented_convs run`` adds to a launch-bound epoch, beyond the layers.

``run`` instruments the layers (the cost ``launch_bound.py`` measures) and also hooks the
training loop: every module call goes through a wrapper (one thread-local read for nested
calls), and the outermost call, ``backward`` and ``optimizer.step`` are regions. It also
records the timeline, and notes what the outermost call and each conv layer call are given
(their inputs' shapes, for the trace's ``args``; ``launch/inputs.py``). Its hooks are
process-wide, so the variants under them install them for their own timed block only. Same
model, data and epoch as ``launch_bound.py`` (a 3-layer model on 256 nodes, full training
steps, one thread); variants interleaved, the order reversed every other round:

- ``stock``: the framework's layers, no hooks;
- ``ours``: the instrumented layers, no hooks (what an import change gives);
- ``ours + timeline``: the same with ``configure(timeline=...)`` on (no hooks, no notes);
- ``under run``: a stock copy under ``run``'s hooks (instrumented by them at its first call),
  the timeline off (``run --trace-limit 0``);
- ``run + timeline``: a stock copy under the hooks with the timeline on, the inputs noted:
  what ``run`` does by default;
- ``run, no inputs``: the same model copy as ``run + timeline``, the same, but the hooks
  note no inputs (``Hooks(inputs=False)``): the difference is the notes' own cost;
- ``stock again``: the A/A noise floor.

A new, empty timeline each timing (as ``launch_bound.py``'s ``timeline`` variant). Reported
per layer: ratios to stock (medians of per-round ratios), and per epoch (medians of per-round
differences, microseconds): the hooks' own cost (under run - ours), the timeline's without
the hooks (ours + timeline - ours), the notes' (run + timeline - run, no inputs) and that
over the calls noted in an epoch (the outermost call and every conv layer call). Then the
notes in place, per call: the median time of the hooks' ``note_inputs`` timed inside the
epochs (two clock reads around it), beside a no-op timed the same way (the floor), over
``--epochs-in-place`` epochs under ``run + timeline``, every other epoch each.

    python benchmarks/run_cost.py                      # PyG GCNConv and DGL GraphConv
    python benchmarks/run_cost.py --layers "PyG GATConv" --rounds 50
    python benchmarks/run_cost.py --quick              # a smoke run (CI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import launch_bound as lb  # noqa: E402

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.commands.launch.hooks import Hooks  # noqa: E402

VARIANTS = (
    "stock",
    "ours",
    "ours + timeline",
    "under run",
    "run + timeline",
    "run, no inputs",
    "stock again",
)
TIMELINE = 10_000_000  # calls: never reached in a block


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


def _noted_calls(hooks: Hooks, epoch: Any) -> int:
    """Calls one epoch under ``run`` puts on the trace with their inputs in ``args``."""
    hooks.install()
    try:
        with ic.configure(timeline=TIMELINE):
            epoch()
            trace = ic.registry.timeline().to_chrome()
    finally:
        hooks.close()
        hooks.remove()
    ic.registry.reset()
    return sum("inputs" in e.get("args", {}) for e in trace["traceEvents"] if e["ph"] == "X")


def _in_place(hooks: Hooks, epoch: Any, epochs: int) -> Dict[str, float]:
    """Median ns of one call of the hooks' ``note_inputs`` inside the epochs, and of a no-op
    timed the same way (every other epoch each)."""
    from instrumented_convs.commands.launch import hooks as module

    real, clock = module.note_inputs, time.perf_counter_ns
    times: Dict[str, List[int]] = {"notes": [], "floor": []}

    def timed(which: str, fn: Any) -> Any:
        def wrapper(*args: Any) -> None:
            t0 = clock()
            fn(*args)
            times[which].append(clock() - t0)

        return wrapper

    variants = (timed("floor", lambda *args: None), timed("notes", real))
    hooks.install()
    try:
        with ic.configure(timeline=TIMELINE):
            for i in range(epochs):
                module.note_inputs = variants[i % 2]
                epoch()
    finally:
        module.note_inputs = real
        hooks.close()
        hooks.remove()
    ic.registry.reset()
    return {k: statistics.median(v) for k, v in times.items()}


def measure(label: str, rounds: int, warmup: int, in_place: int) -> Dict[str, Any]:
    """Interleaved epochs of the variants for one layer; then the notes in place."""
    ours = ("ours", "ours + timeline")
    names = [v for v in VARIANTS if v != "run, no inputs"]  # it shares run + timeline's copy
    models, epochs, _ = lb.variant_models(label, names, lambda v: v in ours)
    epochs["run, no inputs"] = epochs["run + timeline"]
    calls = _module_calls(models["under run"], epochs["under run"])
    hooks = Hooks()

    def hooked(variant: str, timeline: int, inputs: bool = True) -> float:
        hooks.inputs = inputs
        hooks.install()
        try:
            with ic.configure(timeline=timeline):  # on: a new, empty timeline; off at the end
                return lb._timed(epochs[variant])
        finally:
            hooks.close()
            hooks.remove()
            hooks.inputs = True

    def timed(variant: str, timeline: int = 0) -> float:
        with ic.configure(timeline=timeline):
            return lb._timed(epochs[variant])

    variants = {v: (lambda v=v: timed(v)) for v in VARIANTS}
    variants["ours + timeline"] = lambda: timed("ours + timeline", TIMELINE)
    variants["under run"] = lambda: hooked("under run", 0)
    variants["run + timeline"] = lambda: hooked("run + timeline", TIMELINE)
    variants["run, no inputs"] = lambda: hooked("run, no inputs", TIMELINE, inputs=False)
    times = lb._interleave(variants, rounds, warmup)
    ic.registry.reset()
    noted = _noted_calls(hooks, epochs["run + timeline"])
    place = _in_place(hooks, epochs["run + timeline"], in_place)
    ratio = lambda a, b: statistics.median([p / q for p, q in zip(times[a], times[b])])  # noqa: E731
    diff = lambda a, b: statistics.median([p - q for p, q in zip(times[a], times[b])])  # noqa: E731
    hooks_us, notes_us = diff("under run", "ours"), diff("run + timeline", "run, no inputs")
    regions = 3  # forward, backward, optimizer.step
    return {
        "rounds": rounds,
        "median_us": {v: statistics.median(t) for v, t in times.items()},
        "ratio": {v: ratio(v, "stock") for v in VARIANTS[1:]},
        "hooks_us_per_epoch": hooks_us,
        "module_calls": calls,
        "hooks_us_per_call_and_region": hooks_us / (calls + regions),
        "timeline_us_per_epoch": diff("ours + timeline", "ours"),
        "notes_us_per_epoch": notes_us,
        "noted_calls": noted,
        "notes_us_per_call": notes_us / max(noted, 1),
        "notes_in_place_ns": place["notes"],
        "floor_in_place_ns": place["floor"],
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
    p.add_argument(
        "--epochs-in-place", type=int, default=400, help="epochs timing the notes in place"
    )
    p.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.block, args.epochs_in_place = 3, 1, 2, 4
    lb.BLOCK = args.block
    torch.set_num_threads(1)
    print(
        f"run's hooks at the launch-bound proxy ({lb.NODES} nodes, full training steps, "
        f"1 thread): medians of {args.rounds} interleaved rounds of {lb.BLOCK} epochs: ratios "
        "to stock, us an epoch; the notes in place: median ns a call, "
        f"{args.epochs_in_place} epochs"
    )
    print(
        f"  {'layer':14s} {'stock us':>8s} {'ours':>6s} {'ours+tl':>7s} {'run':>6s} "
        f"{'run+tl':>6s} {'no inp':>6s} {'A/A':>6s} | {'hooks':>5s} {'calls':>5s} "
        f"{'/call+rg':>8s} {'tl':>5s} {'notes':>5s} {'noted':>5s} {'/noted':>6s} | "
        f"{'in place':>8s} {'floor':>6s}"
    )
    for label in args.layers:
        try:
            r = measure(label, args.rounds, args.warmup, args.epochs_in_place)
        except ImportError as exc:
            print(f"  {label:14s} skipped: {exc}")
            continue
        q = r["ratio"]
        print(
            f"  {label:14s} {r['median_us']['stock']:8.0f} {q['ours']:6.3f} "
            f"{q['ours + timeline']:7.3f} {q['under run']:6.3f} {q['run + timeline']:6.3f} "
            f"{q['run, no inputs']:6.3f} {q['stock again']:6.3f} | "
            f"{r['hooks_us_per_epoch']:5.1f} {r['module_calls']:5d} "
            f"{r['hooks_us_per_call_and_region']:8.2f} {r['timeline_us_per_epoch']:5.1f} "
            f"{r['notes_us_per_epoch']:5.1f} {r['noted_calls']:5d} {r['notes_us_per_call']:6.2f} "
            f"| {r['notes_in_place_ns']:8.0f} {r['floor_in_place_ns']:6.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
