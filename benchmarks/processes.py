"""Measuring one layer at the launch-bound proxy in several fresh processes, one after
another (a shared 2-core VM moves by a few percent between processes): the flags such a
benchmark takes, and its children run and read back (``cycle_cost.py``, ``nsys_cost.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import launch_bound as lb
import torch

#: A child's result: one process's measurement of one layer (its JSON).
Run = Dict[str, Any]


def parse(doc: str, layers: Sequence[str], argv: Optional[List[str]]) -> argparse.Namespace:
    """The flags (``--layers``, ``--processes``, ``--rounds``, ``--warmup``, ``--block``,
    ``--quick``, ``--json``, and ``--child`` for a child), ``--quick`` applied, the proxy's
    block size and threads set."""
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layers", nargs="+", default=list(layers), choices=list(lb.LAYERS))
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
    return args


def child(args: argparse.Namespace, one: Callable[[str, int, int], Run]) -> int:
    """In a child: measure the first layer with ``one(label, rounds, warmup)``, print it."""
    print(json.dumps(one(args.layers[0], args.rounds, args.warmup)))
    return 0


def runs(script: str, label: str, args: argparse.Namespace) -> List[Run]:
    """``args.processes`` children of ``script`` measuring ``label``, one after another (fewer
    where one fails: its last line of stderr printed)."""
    out: List[Run] = []
    for _ in range(args.processes):
        cmd = [sys.executable, "-W", "ignore", script, "--child", "--layers", label]
        cmd += ["--rounds", str(args.rounds), "--warmup", str(args.warmup)]
        cmd += ["--block", str(args.block)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [""])[-1]
            print(f"  {label:27s} skipped: {last[:90]}")
            break
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def write(path: Optional[str], results: Dict[str, Any]) -> None:
    """The results as JSON at ``path`` (None: nowhere)."""
    if path:
        with open(path, "w") as fh:
            json.dump(results, fh, indent=2)
