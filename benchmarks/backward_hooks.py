"""What it costs to see a step's backward: autograd hook mechanisms, side by side.

Each variant builds a chain of ``--nodes`` small autograd nodes (``y = y * 1.0001`` on a
3-element tensor) and runs its backward; the variants differ only in what they attach to
every node, so (variant - bare) / nodes is the cost of one mechanism per node, forward
(setting it up) plus backward (calling it):

- ``bare``: nothing attached;
- ``tensor hook``: ``Tensor.register_hook`` on each intermediate;
- ``node pre-hook`` / ``node post-hook`` / ``node pre+post``: ``grad_fn.register_prehook`` /
  ``register_hook``, what instrumented_convs uses (at most one of each per step);
- ``multi-grad hook``: ``torch.autograd.graph.register_multi_grad_hook`` on each intermediate;
- ``identity Function``: an identity ``torch.autograd.Function`` marker after each node;
- ``sequence number``: two reads of autograd's sequence counter (what each step does in
  forward to find its nodes);
- ``@step, backward on`` / ``@step, backward off``: each node inside its own ``@step``
  function, with backward timing on and off (their difference is our whole backward cost).

Variants are interleaved round by round; the table gives the median over rounds.

    python benchmarks/backward_hooks.py [--nodes 50] [--reps 20] [--rounds 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

import instrumented_convs as ic
from instrumented_convs.layers import step


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, a: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return a.view_as(a)

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return g


def _pre(g: object) -> None:
    return None


def _post(gi: object, go: object) -> None:
    return None


_seq = torch._C._autograd._get_sequence_nr


@step("node")
def _stepped(y: torch.Tensor) -> torch.Tensor:
    return y * 1.0001


def _chain(
    attach: Optional[Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, nodes: int
) -> None:
    y = x
    for _ in range(nodes):
        y = y * 1.0001
        if attach is not None:
            y = attach(y)
    y.sum().backward()


def _stepped_chain(x: torch.Tensor, nodes: int) -> None:
    y = x
    for _ in range(nodes):
        y = _stepped(y)
    y.sum().backward()


def _attach(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def tensor_hook(y: torch.Tensor) -> torch.Tensor:
        y.register_hook(_pre)
        return y

    def pre(y: torch.Tensor) -> torch.Tensor:
        y.grad_fn.register_prehook(_pre)
        return y

    def post(y: torch.Tensor) -> torch.Tensor:
        y.grad_fn.register_hook(_post)
        return y

    def both(y: torch.Tensor) -> torch.Tensor:
        y.grad_fn.register_prehook(_pre)
        y.grad_fn.register_hook(_post)
        return y

    def multi(y: torch.Tensor) -> torch.Tensor:
        torch.autograd.graph.register_multi_grad_hook((y,), lambda grads: None)
        return y

    def identity(y: torch.Tensor) -> torch.Tensor:
        return _Identity.apply(y)

    def seq(y: torch.Tensor) -> torch.Tensor:
        _seq()
        _seq()
        return y

    return {
        "tensor hook": tensor_hook,
        "node pre-hook": pre,
        "node post-hook": post,
        "node pre+post": both,
        "multi-grad hook": multi,
        "identity Function": identity,
        "sequence number": seq,
    }[kind]


VARIANTS = (
    "bare",
    "tensor hook",
    "node pre-hook",
    "node post-hook",
    "node pre+post",
    "multi-grad hook",
    "identity Function",
    "sequence number",
    "@step, backward on",
    "@step, backward off",
)


def measure(nodes: int, reps: int, rounds: int) -> Dict[str, float]:
    """Median over ``rounds`` of the extra microseconds per node of each variant over bare."""
    x = torch.randn(3, requires_grad=True)
    runs: Dict[str, Callable[[], None]] = {"bare": lambda: _chain(None, x, nodes)}
    for kind in VARIANTS[1:8]:
        fn = _attach(kind)
        runs[kind] = lambda f=fn: _chain(f, x, nodes)

    def stepped(backward: bool) -> Callable[[], None]:
        def run() -> None:
            saved = ic.configure()
            ic.configure(backward=backward)
            try:
                _stepped_chain(x, nodes)
            finally:
                saved.restore()

        return run

    runs["@step, backward on"] = stepped(True)
    runs["@step, backward off"] = stepped(False)
    times: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds + 1):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
        for v in order:
            t0 = time.perf_counter_ns()
            for _ in range(reps):
                runs[v]()
            if r:  # the first round warms up
                times[v].append((time.perf_counter_ns() - t0) / reps / nodes / 1e3)
        ic.registry.reset()
    base = statistics.median(times["bare"])
    out = {"bare us per node": base}
    out.update({v: statistics.median(times[v]) - base for v in VARIANTS[1:]})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """Measure and print the table; optionally write JSON."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=int, default=50, help="autograd nodes per chain")
    p.add_argument("--reps", type=int, default=20, help="chains per variant per round")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    res = measure(args.nodes, args.reps, args.rounds)
    print(
        f"Backward hook mechanisms: extra us per autograd node, forward + backward "
        f"(median of {args.rounds} rounds; torch {torch.__version__}, Python "
        f"{platform.python_version()})"
    )
    print(f"  {'bare (the node itself)':28s} {res['bare us per node']:8.2f}")
    for v in VARIANTS[1:]:
        print(f"  {v:28s} {res[v]:8.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"torch": torch.__version__, "python": platform.python_version(), "us": res},
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
