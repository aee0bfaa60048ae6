"""Whether ``run``'s figures of a first call read as stock: the tool's one-time work left out.

A small training script (PyG: two lazy ``GCNConv`` layers and a linear head over batches of
small generated graphs from PyG's ``DataLoader``, a lazy-initialisation call under
``torch.no_grad()`` first, then ``--epochs`` epochs, one thread) runs in rounds, each a fresh
process: once stock, timing itself, and once under ``run``, read from its run folder. Per
round (the order reversed every other round), three figures:

- ``no-grad call``: the lazy-initialisation call: its wall time stock, under ``run`` the
  region ``forward (no grad)``'s first call on the timeline, less the tool's one-time work
  inside it (the row leaves it out; the timeline shows the call where it ran);
- ``first iteration``: the first training iteration's forward, backward and optimizer step:
  their wall times stock, the first ``forward``, ``backward`` and ``optimizer.step`` calls
  on ``run``'s timeline, the same way;
- ``wait share``: the loader's share of its passes spent waiting for a batch (each pass from
  its first ``__next__`` to the one that ended it): timed by the script stock, the loader's
  split under ``run``.

Reported: the medians of per-round ratios ``run`` / stock of the first call (``run/stock``)
and of the second (the second no-grad call, the second iteration: the same per-call work of
the tool, the first calls' backward timed in full; for the wait share, what the second
iteration's ratio alone makes of it: stock's wait over a compute that many times longer),
their quotient (``first/later``: 1 when the first call costs the tool what the second
does), and the A/A floor: the ratios of a second stock process's first call to the first's,
their median and range. A figure that kept the tool's one-time work (instrumenting the
model, a layer class's statements made into steps) reads ``first/later`` far above the A/A
range; one that left it out, within it.

    python benchmarks/first_call.py                      # 10 rounds
    python benchmarks/first_call.py --quick --json f.json  # 2 rounds (the tests' smoke run)
    python benchmarks/first_call.py --root /tmp/base     # the package of another checkout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
ITERATION = "first iteration"
FIGURES = ("no-grad call", ITERATION, "wait share")


def child(epochs: int) -> None:
    """The training script (stock torch_geometric): prints its own timings as JSON."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Batch, Data
    from torch_geometric.loader import DataLoader
    from torch_geometric.nn import GraphConv, SAGEConv, global_mean_pool

    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = [
        Data(
            x=torch.randn(40, 16, generator=g),
            edge_index=torch.randint(0, 40, (2, 160), generator=g),
            y=torch.tensor([i % 2]),
        )
        for i in range(128)
    ]

    class Net(torch.nn.Module):
        def __init__(self, conv: Any, features: int) -> None:
            super().__init__()
            self.a, self.b = conv(features, 32), conv(-1 if features < 0 else 32, 32)
            self.out = torch.nn.Linear(32, 2)

        def forward(self, x: Any, edge_index: Any, batch: Any) -> Any:
            x = F.relu(self.a(x, edge_index))
            x = F.relu(self.b(x, edge_index))
            return self.out(global_mean_pool(x, batch))

    loader = DataLoader(data, batch_size=16, shuffle=True, generator=g)
    first = Batch.from_data_list(data[:16])  # (not from the loader: no pass begun)
    now = time.perf_counter_ns
    lazy = Net(SAGEConv, -1)  # an evaluation model, its parameters made at its first call
    calls = []
    for _ in range(2):  # the lazy initialisation, then a call as any other
        t0 = now()
        with torch.no_grad():
            lazy(first.x, first.edge_index, first.batch)
        calls.append((now() - t0) / 1e6)
    model = Net(GraphConv, 16)  # the model trained: its first call in the loader's pass
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    out: Dict[str, Any] = {"no-grad call": calls}  # (first, later: ms)
    iterations: List[float] = []
    wait = span = 0
    for _ in range(epochs):
        it = iter(loader)
        start = None
        while True:
            t0 = now()
            start = t0 if start is None else start
            try:
                batch = next(it)
            except StopIteration:
                span += t0 - start
                break
            wait += now() - t0
            opt.zero_grad()
            t1 = now()
            y = model(batch.x, batch.edge_index, batch.batch)
            t2 = now()
            loss = F.nll_loss(F.log_softmax(y, dim=-1), batch.y)
            t3 = now()
            loss.backward()
            t4 = now()
            opt.step()
            t5 = now()
            iterations.append(((t2 - t1) + (t4 - t3) + (t5 - t4)) / 1e6)
    out["first iteration"] = iterations[:2]
    out["wait share"] = [wait / span, wait / span]
    print("TIMINGS " + json.dumps(out))


def _timings(proc: "subprocess.CompletedProcess[str]") -> Dict[str, float]:
    line = next(x for x in proc.stdout.splitlines() if x.startswith("TIMINGS "))
    return json.loads(line.split(" ", 1)[1])


def _from_run(folder: Path) -> Dict[str, List[float]]:
    """The same figures from ``run``'s folder: the first two calls of its regions on the
    timeline, less the tool's one-time work inside them (the rows leave it out, the
    timeline shows each call where it ran), and its loader's split."""
    sys.path.insert(0, str(ROOT))
    from instrumented_convs.report import read_trace
    from instrumented_convs.report.loaders import pipeline

    run = json.loads((folder / "run.json").read_text())
    trace = read_trace(folder / run["trace"]["file"])
    events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    aside = [(e["ts"], e["dur"]) for e in events if e["name"] == "instrumented_convs (setup)"]
    calls: Dict[str, List[float]] = {}  # region -> its calls' ms, in order, the tool's left out
    for e in events:
        inside = sum(d for t, d in aside if e["ts"] <= t < e["ts"] + e["dur"])
        calls.setdefault(e["name"], []).append((e["dur"] - inside) / 1e3)
    parts = [calls[n][:2] for n in ("forward", "backward", "optimizer.step")]
    (split,) = pipeline(run["workers"])
    return {
        "no-grad call": calls["forward (no grad)"][:2],
        "first iteration": [sum(p[0] for p in parts), sum(p[1] for p in parts)],
        "wait share": [split["wait"], split["wait"]],
    }


def _round(args: argparse.Namespace, order: List[str], env: Dict[str, str]) -> Dict[str, Any]:
    got: Dict[str, Any] = {}
    script = [str(HERE), "--child", "--epochs", str(args.epochs)]
    for variant in order:
        if variant == "run":
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp) / "run"
                cmd = [sys.executable, "-m", "instrumented_convs", "run", "-o", str(folder)]
                subprocess.run(
                    cmd + script, env=env, check=True, capture_output=True, text=True, cwd=tmp
                )
                got[variant] = _from_run(folder)
        else:
            proc = subprocess.run(
                [sys.executable, *script], env=env, check=True, capture_output=True, text=True
            )
            got[variant] = _timings(proc)
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="2 rounds: a smoke run")
    p.add_argument("--root", default=str(ROOT), help="the checkout whose package runs")
    p.add_argument("--json", metavar="FILE", help="the medians, per figure")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.epochs)
        return
    if args.quick:
        args.rounds = 2
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(x for x in (args.root, env.get("PYTHONPATH")) if x)
    rounds = []
    for i in range(args.rounds):
        order = ["stock", "run", "stock again"]
        rounds.append(_round(args, order if i % 2 == 0 else order[::-1], env))
    print(f"{args.rounds} rounds, {args.epochs} epochs each, package from {args.root}")
    print(
        f"{'figure':<16} {'stock':>11} {'run/stock':>10} {'later run/stock':>16} "
        f"{'first/later':>12} {'A/A':>6} {'A/A range':>12}"
    )
    out: Dict[str, Any] = {}
    for name in FIGURES:
        stock = [r["stock"][name][0] for r in rounds]
        first = [r["run"][name][0] / r["stock"][name][0] for r in rounds]
        later = [r["run"][name][1] / r["stock"][name][1] for r in rounds]
        if name == "wait share":  # what the later iterations' cost alone makes of it
            it = [r["run"][ITERATION][1] / r["stock"][ITERATION][1] for r in rounds]
            w = [r["stock"][name][0] for r in rounds]
            later = [1 / (s + (1 - s) * c) for s, c in zip(w, it)]
        aa = [r["stock again"][name][0] / r["stock"][name][0] for r in rounds]
        out[name] = {
            "stock": statistics.median(stock),
            "first": statistics.median(first),
            "later": statistics.median(later),
            "first/later": statistics.median(f / x for f, x in zip(first, later)),
            "aa": statistics.median(aa),
            "aa_range": [min(aa), max(aa)],
        }
        unit = "" if name == "wait share" else " ms"
        print(
            f"{name:<16} {statistics.median(stock):>8.3f}{unit:<3} "
            f"{statistics.median(first):>10.3f} {statistics.median(later):>16.3f} "
            f"{statistics.median(f / x for f, x in zip(first, later)):>12.3f} "
            f"{statistics.median(aa):>6.3f} {min(aa):>5.3f}-{max(aa):.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
