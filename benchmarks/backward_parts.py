"""What backward timing costs a layer call, by parts, on the launch-bound proxy.

The proxy of ``benchmarks/launch_bound.py`` (256 nodes, full training steps, one thread), one
layer, five copies of the model timed in interleaved rounds of ``--block`` epochs (the order
reversed every other round); extra microseconds per epoch over stock, and per layer call:

- ``backward off``: ``configure(backward=False)``: the forward rows only;
- ``defaults``: ``backward_every=16``: 1 call in 16 timed step by step, the others counted;
- ``every call counted``: the sampling draw forced to *count* (after the first 16 calls):
  the cost of counting alone;
- ``every call timed``: ``backward_every=1``: the cost of timing every call's backward;
- ``node ranges only``: backward timing on, but the anchor's exit does nothing
  (``anchor.finish`` replaced, the C extension's exit turned off): what the forward's
  logging of node ranges costs alone
  (each nested step reading autograd's sequence counter at entry and exit, the anchor's log);
- ``stock again``: a second stock copy: the noise floor (A/A) of every figure above.

With ``--functions``, one more run (not interleaved, ``--epochs`` epochs, every call counted,
the anchor's exit and the count hook in Python: the C extension's turned off) wraps the
Python functions of the counting path in a ``perf_counter_ns`` pair each (about
0.3 µs of wrapper per call) and prints their time per layer call.

This benchmark reaches into the machinery on purpose (it replaces ``sampling._random`` and,
with ``--functions``, module functions), and puts them back.

    python benchmarks/backward_parts.py                          # PyG GCNConv, 60 rounds
    python benchmarks/backward_parts.py --layer "DGL GraphConv" --functions
    python benchmarks/backward_parts.py --quick                  # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bound as lb  # noqa: E402

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.core.backward import anchor, sampling  # noqa: E402

CALLS = 3  # layer calls per epoch (the proxy's three layers)


def _no_finish(*_: Any) -> None:
    return None


def _with(settings: Dict[str, Any], count_all: Any, fn: Callable[[], float]) -> float:
    """Run ``fn`` with ``settings``; ``count_all``: every call counted (``"ranges"``: and the
    anchor's exit skipped; ``"python"``: the anchor's exit and the count hook in Python);
    everything put back afterwards."""
    saved, draw, finish, fast = ic.configure(), sampling._random, anchor.finish, anchor.fast_exit
    hook = sampling.Count
    if count_all:
        sampling._random = lambda: 1.0  # never chosen at random: counted
    if count_all in ("ranges", "python"):
        anchor.fast_exit = False  # the anchor's exit in Python (the C extension's is skipped)
    if count_all == "python":
        sampling.Count = sampling._Count  # and the count hook's
    if count_all == "ranges":
        anchor.finish = _no_finish
    ic.configure(**settings)
    try:
        return fn()
    finally:
        saved.restore()
        sampling._random = draw
        anchor.finish = finish
        anchor.fast_exit = fast
        sampling.Count = hook


def measure(label: str, rounds: int, warmup: int) -> Dict[str, float]:
    """Median extra µs per epoch over stock of each variant (interleaved)."""
    make_stock, make_ours, (graph, call) = lb.LAYERS[label]()
    torch.manual_seed(0)
    x, y = torch.randn(lb.NODES, lb.FEATURES), torch.randint(0, lb.CLASSES, (lb.NODES,))
    plan = {
        "stock": (make_stock, {}, False),
        "backward off": (make_ours, {"backward": False}, False),
        "defaults": (make_ours, {"backward_every": 16}, False),
        "every call counted": (make_ours, {"backward_every": 16}, True),
        "every call timed": (make_ours, {"backward_every": 1}, False),
        "node ranges only": (make_ours, {"backward_every": 16}, "ranges"),
        "stock again": (make_stock, {}, False),
    }
    torch.manual_seed(1)
    ref = lb.Net(make_stock, call)
    variants: Dict[str, Callable[[], float]] = {}
    for name, (make, settings, count_all) in plan.items():
        m = lb.Net(make, call)
        m.load_state_dict(ref.state_dict())
        epoch = lb._epoch(m, x, graph, y)
        variants[name] = lambda e=epoch, s=settings, c=count_all: _with(s, c, lambda: lb._timed(e))
    times = lb._interleave(variants, rounds, warmup)
    return {
        v: statistics.median([a - b for a, b in zip(times[v], times["stock"])])
        for v in plan
        if v != "stock"
    }


def functions(label: str, epochs: int) -> Dict[str, float]:
    """µs per layer call in each Python function of the counting path (every call counted)."""
    _, make_ours, (graph, call) = lb.LAYERS[label]()
    torch.manual_seed(0)
    x, y = torch.randn(lb.NODES, lb.FEATURES), torch.randint(0, lb.CLASSES, (lb.NODES,))
    epoch = lb._epoch(lb.Net(make_ours, call), x, graph, y)
    spent: Dict[str, int] = {}
    targets = [
        (anchor, "finish"),
        (anchor, "_tensors"),
        (anchor, "_newest"),
        (sampling, "choose"),
        (sampling, "count"),
        (sampling._Count, "__call__"),
        (sampling, "counted"),
    ]
    real = [(owner, name, getattr(owner, name)) for owner, name in targets]

    def wrap(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def timed(*a: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return fn(*a)
            finally:
                spent[key] = spent.get(key, 0) + time.perf_counter_ns() - t0

        return timed

    def run() -> float:
        for _ in range(20):  # past the first 16 calls of each layer (timed, the census)
            epoch()
        for owner, name, fn in real:
            setattr(owner, name, wrap(fn, f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"))
        try:
            for _ in range(epochs):
                epoch()
        finally:
            for owner, name, fn in real:
                setattr(owner, name, fn)
        return 0.0

    _with({"backward_every": 16}, "python", run)
    return {k: v / epochs / CALLS / 1e3 for k, v in spent.items()}


def main(argv: Optional[List[str]] = None) -> int:
    """Print the parts."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layer", default="PyG GCNConv", choices=list(lb.LAYERS))
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--block", type=int, default=16, help="epochs per timing")
    p.add_argument(
        "--functions", action="store_true", help="also time the counting path's functions"
    )
    p.add_argument("--epochs", type=int, default=200, help="epochs of the --functions run")
    p.add_argument("--quick", action="store_true", help="3 rounds, 2-epoch blocks: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.block, args.epochs = 3, 1, 2, 3
    lb.BLOCK = args.block
    torch.set_num_threads(1)
    print(
        f"Backward timing by parts: {args.layer}, launch-bound proxy, medians of "
        f"{args.rounds} interleaved rounds of {args.block} epochs; extra µs over stock"
    )
    for name, us in measure(args.layer, args.rounds, args.warmup).items():
        print(f"  {name:22s} {us:8.1f} per epoch {us / CALLS:8.1f} per layer call")
    if args.functions:
        print(
            f"Counting path, µs per layer call in each function ({args.epochs} epochs, "
            "wrappers included):"
        )
        for name, us in functions(args.layer, args.epochs).items():
            print(f"  {name:22s} {us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
