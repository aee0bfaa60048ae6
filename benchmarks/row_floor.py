"""The least a recorded row can cost on this machine, where rows are: between torch ops.

``launch_bound.py`` reports microseconds per recorded row beside the *bare-Python floor*
(a call, ``perf_counter_ns()``, a ``with``, each timed in a loop of nothing else). Rows are
not recorded in such a loop: each one sits between two torch ops, whose dispatch is long
C++ code, and the Python around it runs with colder caches and branch predictors than in a
loop of its own. This benchmark measures the floor where rows are:

- **forward**: a chain of ``--ops`` small ops (a 256 x 32 matmul, add, ReLU, gather: a
  layer's ops at the proxy's size, no grad, one thread), bare, and with each op inside a
  ``with`` of: a ``threading.Lock`` (a C context manager that does nothing to speak of: the
  least any per-row Python can cost there), a pair of ``perf_counter_ns()`` calls (the
  least any timing can cost), and our nested step on the C fast path (the chain inside one
  top-level step: one row more). Cost per row = (variant - bare) / rows.
- **backward**: a chain of ``--ops`` ``relu(h @ w)`` and its full backward, bare, and with
  a hook that does nothing on every op: through the output tensor's own hook dictionary
  (how ``sampling.count`` counts a call whose backward is not timed), and as a node
  pre-hook (how a timed call's steps are hooked). Cost per hook = (variant - bare) / ops:
  the forward's registration and the engine's call into Python.

Each timing is a block of ``--block`` chains; variants interleaved, the order reversed
every other round, a second bare run as the A/A floor; medians of per-round differences.
Then, per layer of the launch-bound proxy: the rows it records per epoch and the *implied
floor* of its defaults: forward rows x the step's in-context cost + one counting hook per
layer call, as a ratio to the stock epoch; that is, what the defaults would cost if the
library's Python beyond the step and the hook cost nothing.

    python benchmarks/row_floor.py                       # 200 rounds, every layer
    python benchmarks/row_floor.py --layers "PyG GCNConv" --rounds 100
    python benchmarks/row_floor.py --quick               # a smoke run (CI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bound as lb  # noqa: E402

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.core.steps.step import Step  # noqa: E402
from instrumented_convs.core.steps.stepbase import IMPLEMENTATION  # noqa: E402

BLOCK = 20  # chains per timing (--block)


def _none(*_: Any) -> None:
    return None


def _forward_variants(ops: int) -> Dict[str, Callable[[], None]]:
    """The forward chain of ``ops`` small ops, bare and with each op wrapped three ways."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(lb.NODES, lb.HIDDEN, generator=g)
    w = torch.randn(lb.HIDDEN, lb.HIDDEN, generator=g)
    idx = torch.randint(0, lb.NODES, (lb.EDGES,), generator=g)
    kinds = [
        lambda h: h @ w,
        lambda h: h + x,
        torch.relu,
        lambda h: h.index_select(0, idx)[: lb.NODES],
    ]
    chain = [kinds[i % len(kinds)] for i in range(ops)]
    lock = threading.Lock()
    clock = time.perf_counter_ns
    top = Step("row_floor", scope="row_floor", device=torch.device("cpu"))
    steps = [Step(f"op{i}") for i in range(ops)]

    def bare() -> None:
        h = x
        for f in chain:
            h = f(h)

    def locked() -> None:
        h = x
        for f in chain:
            with lock:
                h = f(h)

    def clocked() -> None:
        h = x
        for f in chain:
            t0 = clock()
            h = f(h)
            clock() - t0

    def stepped() -> None:
        h = x
        with top:
            for f, s in zip(chain, steps):
                with s:
                    h = f(h)

    return {
        "bare": bare,
        "bare again": bare,
        "with a C lock": locked,
        "perf_counter_ns pair": clocked,
        "our nested step": stepped,
    }


def _backward_variants(ops: int) -> Dict[str, Callable[[], None]]:
    """A chain of ``ops`` ``relu(h @ w)`` and its backward: no hook, a no-op hook per op two
    ways."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(lb.NODES, lb.HIDDEN, generator=g)
    w = torch.randn(lb.HIDDEN, lb.HIDDEN, generator=g).div_(lb.HIDDEN**0.5).requires_grad_()

    def chain(hook: Optional[Callable[[torch.Tensor], None]]) -> Callable[[], None]:
        def run() -> None:
            w.grad = None
            h = x
            for _ in range(ops):
                h = torch.relu(h @ w)
                if hook is not None:
                    hook(h)
            h.sum().backward()

        return run

    def tensor_hook(t: torch.Tensor) -> None:  # as _sampling.count registers its hook
        t._backward_hooks = hooks = OrderedDict()
        t.grad_fn._register_hook_dict(t)
        hooks[0] = _none

    def node_prehook(t: torch.Tensor) -> None:  # as _anchor.walk hooks a step's first node
        t.grad_fn.register_prehook(_none)

    return {
        "bare": chain(None),
        "bare again": chain(None),
        "tensor hook": chain(tensor_hook),
        "node pre-hook": chain(node_prehook),
    }


def _per_round(fns: Dict[str, Callable[[], None]], rounds: int, warmup: int) -> Dict[str, float]:
    """Median over interleaved rounds of (variant - bare), µs per chain."""

    def timed(fn: Callable[[], None]) -> Callable[[], float]:
        def t() -> float:
            t0 = time.perf_counter_ns()
            for _ in range(BLOCK):
                fn()
            return (time.perf_counter_ns() - t0) / 1e3 / BLOCK

        return t

    times = lb._interleave({k: timed(f) for k, f in fns.items()}, rounds, warmup)
    out = {"bare": statistics.median(times["bare"])}
    for k in fns:
        if k != "bare":
            out[k] = statistics.median([a - b for a, b in zip(times[k], times["bare"])])
    return out


def measure(ops: int, rounds: int, warmup: int) -> Dict[str, Any]:
    """The forward floor per row and the backward floor per hook, µs."""
    saved = ic.configure()
    ic.configure(backward=False)  # the forward floor: rows only (no grad anyway)
    try:
        with torch.no_grad():
            fwd = _per_round(_forward_variants(ops), rounds, warmup)
    finally:
        saved.restore()
    bwd = _per_round(_backward_variants(ops), rounds, warmup)
    per_row = {
        k: v / (ops + 1 if k == "our nested step" else ops) for k, v in fwd.items() if k != "bare"
    }
    per_hook = {k: v / ops for k, v in bwd.items() if k != "bare"}
    return {
        "ops": ops,
        "forward_chain_us": fwd["bare"],
        "backward_chain_us": bwd["bare"],
        "forward_us_per_row": per_row,
        "backward_us_per_hook": per_hook,
    }


def implied(label: str, step_us: float, hook_us: float, rounds: int) -> Dict[str, Any]:
    """The proxy's rows for ``label`` and the ratio its defaults would have at the floor."""
    make_stock, make_ours, (graph, call) = lb.LAYERS[label]()
    torch.manual_seed(0)
    x, y = torch.randn(lb.NODES, lb.FEATURES), torch.randint(0, lb.CLASSES, (lb.NODES,))
    stock = lb._epoch(lb.Net(make_stock, call), x, graph, y)
    ours = lb._epoch(lb.Net(make_ours, call), x, graph, y)
    fwd, bwd = lb._rows_per_epoch(ours)
    epoch = statistics.median(lb._timed(stock) for _ in range(max(rounds // 10, 2)))
    extra = fwd * step_us + 3 * hook_us  # three layer calls an epoch, one counting hook each
    return {
        "stock_us": epoch,
        "forward_rows": fwd,
        "backward_rows": bwd,
        "floor_extra_us": extra,
        "floor_ratio": 1 + extra / epoch,
    }


def main(argv: Optional[List[str]] = None) -> int:
    """Print the floors and, per layer, the implied floor of the launch-bound proxy."""
    global BLOCK
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--layers", nargs="+", default=list(lb.LAYERS), choices=list(lb.LAYERS), metavar="LAYER"
    )
    p.add_argument("--ops", type=int, default=16, help="ops per chain")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--block", type=int, default=20, help="chains per timing")
    p.add_argument("--quick", action="store_true", help="3 rounds, 2-chain blocks: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.block = 3, 1, 2
    BLOCK = lb.BLOCK = args.block
    torch.set_num_threads(1)
    r = measure(args.ops, args.rounds, args.warmup)
    print(
        f"Row floor: chains of {args.ops} ops at the launch-bound size, 1 thread; medians of "
        f"{args.rounds} interleaved rounds of {BLOCK} chains ({ic.configure().nvtx} NVTX "
        f"backend, implementation {IMPLEMENTATION})"
    )
    print(
        "  bare-Python floor (in a loop of nothing), ns: "
        + ", ".join(f"{k} {v:.0f}" for k, v in lb.python_floor().items())
    )
    print(f"  forward, µs per row around an op (bare chain {r['forward_chain_us']:.1f} µs):")
    for k, v in r["forward_us_per_row"].items():
        print(f"    {k:24s} {v:7.2f}")
    print(
        f"  backward, µs per hooked op (bare chain and backward {r['backward_chain_us']:.1f} µs):"
    )
    for k, v in r["backward_us_per_hook"].items():
        print(f"    {k:24s} {v:7.2f}")
    step_us = max(r["forward_us_per_row"]["our nested step"], 0.0)
    hook_us = max(r["backward_us_per_hook"]["tensor hook"], 0.0)
    print(
        f"  implied floor of the proxy's defaults: fwd rows x {step_us:.2f} µs"
        f" + 3 layer calls x {hook_us:.2f} µs"
    )
    print(
        f"    {'layer':27s} {'stock us':>9s} {'fwd rows':>8s} {'bwd rows':>8s} {'floor us':>9s}"
        f" {'floor ratio':>11s}"
    )
    for label in args.layers:
        try:
            q = implied(label, step_us, hook_us, args.rounds)
        except ImportError as exc:
            print(f"    {label:27s} skipped: {exc}")
            continue
        print(
            f"    {label:27s} {q['stock_us']:9.0f} {q['forward_rows']:8d} {q['backward_rows']:8d} "
            f"{q['floor_extra_us']:9.1f} {q['floor_ratio']:11.3f}",
            flush=True,
        )
    ic.registry.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
