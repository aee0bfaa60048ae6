"""How much of each layer's time is in no named step: its self share, forward and backward.

Every instrumented conv layer of PyG and DGL runs its first test case (tests/conv_cases_*.py;
with ``--all-cases`` every case: each option and input kind, labelled by the case's id) on
graphs of Cora's size (2,708 nodes, 10,556 edges: ``INSTRUMENTED_CONVS_CASES=cora``, the
features at the cases' widths, 4 to 16), forward and backward, every backward timed
(``backward_every=1``), one thread. The self share of a layer is its row's self time over its
total in ``--calls`` calls after ``--warmup``, the median of ``--rounds`` rounds; the ten
worst of each column are listed, and ``--json`` keeps every figure.

    PYTHONPATH=. $(bash scripts/env.sh main)/bin/python benchmarks/self_share.py
    PYTHONPATH=. ... benchmarks/self_share.py --only GATConv GINConv --framework pyg
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

os.environ["INSTRUMENTED_CONVS_CASES"] = "cora"
os.environ.setdefault("DGLBACKEND", "pytorch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import instrumented_convs as ic  # noqa: E402


def shares(fw: str, case, calls: int, warmup: int, rounds: int) -> Dict[str, Optional[float]]:
    """The forward and backward self share of ``case``'s layer (None: no backward row): the
    median over ``rounds`` of the share in ``calls`` calls (a preemption on this shared
    machine lands in one round, not in the median)."""
    cases = importlib.import_module(f"tests.conv_cases_{fw}")
    ours_cls = getattr(importlib.import_module(f"instrumented_convs.{fw}"), case.name)
    _, ours = cases.build_pair(case, ours_cls)
    for _ in range(warmup):
        cases.run(ours, case)
    got: Dict[str, List[float]] = {}
    for _ in range(rounds):
        ic.registry.reset()
        t0 = time.perf_counter()
        for _ in range(calls):
            cases.run(ours, case)
        got.setdefault("ms", []).append(1e3 * (time.perf_counter() - t0) / calls)
        for row in ic.registry.summary().rows:
            if row.name == case.name and row.total > 0:
                got.setdefault(row.phase, []).append(row.self_time / row.total)
                got.setdefault(f"{row.phase}_ms", []).append(1e3 * row.total / calls)
    out: Dict[str, Optional[float]] = {"forward": None, "backward": None}
    out.update({k: statistics.median(v) for k, v in got.items()})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """Measure, print the worst ten of each column, optionally save everything as JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", choices=["pyg", "dgl", "both"], default="both")
    p.add_argument("--only", nargs="*", help="class names (default: every layer)")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--all-cases",
        action="store_true",
        help="every test case of every layer (each option and input kind), not the first",
    )
    p.add_argument("--json", help="write every layer's figures here")
    p.add_argument(
        "--before",
        metavar="JSON",
        help="a --json of another run (the code before a change): print, per phase, the "
        "ten worst layers of either run with both runs' shares, as Markdown",
    )
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    ic.configure(backward_every=1)
    results: Dict[str, Dict[str, Optional[float]]] = {}
    failed = 0
    for fw in ("pyg", "dgl") if a.framework == "both" else (a.framework,):
        cases = importlib.import_module(f"tests.conv_cases_{fw}")
        seen = set()
        for case in cases.CASES:
            if (case.name in seen and not a.all_cases) or (a.only and case.name not in a.only):
                continue
            seen.add(case.name)
            label = f"{'PyG' if fw == 'pyg' else 'DGL'} {case.id if a.all_cases else case.name}"
            t0 = time.perf_counter()
            try:
                results[label] = shares(fw, case, a.calls, a.warmup, a.rounds)
                print(f"{label}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            except ImportError as e:  # an optional package (torch-sparse) is missing
                print(f"{label}: not measured ({e})", file=sys.stderr)
            except Exception as e:  # noqa: BLE001 - reported, and the exit code says so
                print(f"{label}: FAILED ({type(e).__name__}: {e})", file=sys.stderr)
                failed += 1
    for phase in ("forward", "backward"):
        ranked = sorted(
            ((v[phase], k) for k, v in results.items() if v[phase] is not None), reverse=True
        )
        print(f"\nSelf share, {phase} (worst ten of {len(ranked)} layers):")
        for share, label in ranked[:10]:
            print(f"  {label:<36} {100 * share:5.1f}%  ({results[label][phase + '_ms']:.2f} ms)")
        over = [k for s, k in ranked if s > 0.10]
        print(f"  over 10%: {len(over)}" + (f" ({', '.join(over)})" if over else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    if a.before:
        with open(a.before) as f:
            print(compare(json.load(f), results))
    return 1 if failed else 0


def compare(before: Dict[str, Dict], after: Dict[str, Dict]) -> str:
    """Markdown: per phase, the ten worst layers before and the ten worst after (a layer in
    both lists once), with both shares, worst before first."""

    def pct(v: Optional[float]) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    out = []
    for phase in ("forward", "backward"):
        worst = []
        for run in (before, after):
            ranked = sorted(
                (k for k in run if run[k].get(phase) is not None), key=lambda k: -run[k][phase]
            )
            worst += [k for k in ranked[:10] if k not in worst]
        worst.sort(key=lambda k: -(before.get(k, {}).get(phase) or 0))
        out += [f"| layer ({phase}) | self share before | after |", "|---|---|---|"]
        out += [
            f"| {k} | {pct(before.get(k, {}).get(phase))} | {pct(after.get(k, {}).get(phase))} |"
            for k in worst
        ]
        over = [sum(1 for v in r.values() if (v.get(phase) or 0) > 0.10) for r in (before, after)]
        out += [f"| over 10% | {over[0]} of {len(before)} | {over[1]} of {len(after)} |", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
