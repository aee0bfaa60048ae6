"""What a nested step leaves in its parent's own time: the part of the tool no clock sees.

A step's enters, exits and backward hooks read the clock at both ends and leave what they
spent out of the steps around them (``Frame.own``); what runs before the first reading and
after the last one (CPython calling ``__enter__``/``__exit__``, autograd calling a hook)
stays in the parent's self time. Here a parent step holds ``--children`` steps, each one
small node (``y = y * 1.0001`` on a 10-element tensor), forward and backward, every backward
timed; the parent's self time per child is that residue, per direction. For scale, the
same chain with a do-nothing pre-hook and post-hook on each node, against none: what
autograd spends calling a Python hook pair at all.

    PYTHONPATH=. python benchmarks/step_residual.py [--children 20] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Dict, List, Optional

import torch

import instrumented_convs as ic
from instrumented_convs.layers import Step, mark_outputs


def _noop_pre(grad_outputs: object) -> None:
    return None


def _noop_post(grad_inputs: object, grad_outputs: object) -> None:
    return None


def residue(children: int, calls: int) -> Dict[str, float]:
    """The parent's self time per child (us), forward and backward, over ``calls`` calls."""
    parent, steps = Step("parent"), [Step(f"c{i}") for i in range(children)]
    x = torch.ones(10, requires_grad=True)
    ic.registry.reset()
    for _ in range(calls):
        with parent:
            y = x
            for s in steps:
                with s:
                    y = y * 1.0001
            mark_outputs(y)
        y.sum().backward()
    out = {}
    for r in ic.registry.summary().rows:
        if r.name == "parent":
            out[r.phase] = 1e6 * r.self_time / r.count / children
    return out


def hook_pair(children: int, calls: int) -> float:
    """What autograd spends calling a do-nothing Python pre-hook and post-hook, per node."""
    x = torch.ones(10, requires_grad=True)

    def run(hooks: bool) -> float:
        best = []
        for _ in range(calls):
            y = x
            for _ in range(children):
                y = y * 1.0001
                if hooks:
                    y.grad_fn.register_prehook(_noop_pre)
                    y.grad_fn.register_hook(_noop_post)
            t0 = time.perf_counter_ns()
            y.sum().backward()
            best.append(time.perf_counter_ns() - t0)
        return statistics.median(best) / 1000

    return (run(True) - run(False)) / children


def main(argv: Optional[List[str]] = None) -> int:
    """Measure, print the medians over rounds, optionally save them as JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--children", type=int, default=20)
    p.add_argument("--calls", type=int, default=200, help="calls per round")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    ic.configure(backward_every=1)
    residue(a.children, 20)  # warm-up: every path exists
    got: Dict[str, List[float]] = {"forward": [], "backward": [], "hook pair": []}
    for _ in range(a.rounds):
        r = residue(a.children, a.calls)
        got["forward"].append(r["forward"])
        got["backward"].append(r["backward"])
        got["hook pair"].append(hook_pair(a.children, a.calls))
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"implementation: {ic.layers.Step.__mro__[1].__module__}")
    print(f"left in the parent per nested step, forward:  {med['forward']:.2f} us")
    print(f"left in the parent per nested step, backward: {med['backward']:.2f} us")
    print(f"autograd calling a do-nothing Python pre- and post-hook: {med['hook pair']:.2f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(med, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
