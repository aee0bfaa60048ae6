"""Does a sampled run tell the same story? The duty cycle's table against a full recording.

Trains the study's 3-layer GCN (PyG ``GCNConv``, DGL ``GraphConv``; hidden 128) on a
generated graph of Cora's or ogbn-arxiv's shape, each iteration inside ``region("epoch")``,
in four runs of ``--iterations`` iterations (after a tenth as many warm-up ones, at least 5,
dropped): recorded in full
(A), one iteration in ``--every`` (B: ``configure(record_every=K)``), in full again (A'), and
sampled again (B'). For every row it prints its share of the epoch in A and B and the
difference in points, and for each layer (the conv class's forward and backward rows) its
mean time per call in both and the difference in percent; A against A' beside it is this
machine's run-to-run floor for the same numbers. The goals (issue 39): every share within 2
points, every layer's mean within 5%.

    python benchmarks/fidelity.py                          # PyG and DGL, Cora's and arxiv's shapes
    python benchmarks/fidelity.py --platforms pyg --shapes synthetic-cora --iterations 50
    python benchmarks/fidelity.py --device cuda            # on a GPU (PyG; DGL needs a CUDA build)
    python benchmarks/fidelity.py --quick                  # a smoke run (CI)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

os.environ.setdefault("DGLBACKEND", "pytorch")

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.commands.study import build_model, load_graph  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bound  # noqa: E402  (its JSON writer)

LAYER = {"pyg": "GCNConv", "dgl": "GraphConv"}
A2, B2 = "A'", "B'"  # the second full run and the second sampled one


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run(
    step: Any, iterations: int, device: torch.device, every: Optional[int]
) -> Tuple[Any, float]:
    """One run: warm-up iterations (a tenth, at least 5), a reset, ``iterations`` recorded
    (every one, or one in ``every``); its summary and its wall time per iteration (ms)."""
    for _ in range(max(5, iterations // 10)):
        step()
    _sync(device)
    ic.registry.reset()
    with ic.configure(record_every=every or 1):
        t0 = time.perf_counter()
        for _ in range(iterations):
            step()
        _sync(device)
        wall = (time.perf_counter() - t0) * 1e3 / iterations
        summary = ic.registry.summary()
    ic.registry.reset()
    return summary, wall


def _shares(summary: Any) -> Dict[Tuple[str, str], float]:
    return {(r.name, r.phase): r.fraction for r in summary.rows}


def _means(summary: Any, layer: str) -> Dict[str, float]:
    return {r.phase: r.mean for r in summary.rows if r.step == layer}


def compare(
    platform_: str, shape: str, iterations: int, every: int, device: torch.device
) -> Dict[str, Any]:
    """The four runs of one model and shape, and what differs between them."""
    data = load_graph(shape, platform=platform_).to(device)
    torch.manual_seed(0)
    model, graph = build_model(platform_, data)
    model = model.to(device)
    if platform_ == "dgl":
        graph = graph.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step() -> None:
        with ic.region("epoch"):
            opt.zero_grad()
            out = model(data.x, graph)
            F.nll_loss(out[data.train_idx], data.y[data.train_idx]).backward()
            opt.step()

    runs = {}
    for name, k in (("A", None), ("B", every), ("A'", None), ("B'", every)):
        runs[name] = _run(step, iterations, device, k)
    layer = LAYER[platform_]
    out: Dict[str, Any] = {
        "wall_ms": {n: w for n, (_, w) in runs.items()},
        "sampling": runs["B"][0].sampling,
        "rows": [],
        "layers": {},
    }
    a, b, a2, b2 = (_shares(runs[n][0]) for n in ("A", "B", "A'", "B'"))
    for key in a:
        out["rows"].append(
            {
                "row": key[0] + (" [backward]" if key[1] == "backward" else ""),
                "A": a[key],
                "B": b.get(key),
                "A'": a2.get(key),
                "B'": b2.get(key),
            }
        )
    ma, mb, ma2, mb2 = (_means(runs[n][0], layer) for n in ("A", "B", "A'", "B'"))
    for phase in ma:
        out["layers"][f"{layer} {phase}"] = {
            "A": ma[phase],
            "B": mb.get(phase),
            "A'": ma2.get(phase),
            "B'": mb2.get(phase),
        }
    return out


def _points(x: Optional[float], y: Optional[float]) -> float:
    return float("nan") if x is None or y is None else 100 * (y - x)


def _percent(x: Optional[float], y: Optional[float]) -> float:
    return float("nan") if not x or y is None else 100 * (y / x - 1)


def _table(
    what: str,
    heads: Tuple[str, str, str],
    unit: str,
    items: List[Dict[str, Any]],
    delta: Any,
    scale: float,
) -> float:
    """Print one part of a comparison (a line per item: A, B, B against A, and A' and B'
    against A); returns the largest |B against A|."""
    others = f"{A2 + '-A ' + unit:>8s} {B2 + '-A ' + unit:>8s}"
    print(f"  {what:44s} {heads[0]:>9s} {heads[1]:>9s} {heads[2]:>7s} {others}")
    worst = 0.0
    for item in items:
        d = delta(item["A"], item["B"])
        worst = max(worst, abs(d)) if d == d else worst
        print(
            f"  {item['row'][:44]:44s} {scale * item['A']:9.2f} {scale * (item['B'] or 0):9.2f} "
            f"{d:+7.2f} {delta(item['A'], item[A2]):+8.2f} {delta(item['A'], item[B2]):+8.2f}"
        )
    return worst


def main(argv: Optional[List[str]] = None) -> int:
    """Print the comparison (and write JSON with --json)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--platforms", nargs="+", default=["pyg", "dgl"], choices=["pyg", "dgl"])
    p.add_argument(
        "--shapes", nargs="+", default=["synthetic-cora", "synthetic-arxiv"], metavar="SHAPE"
    )
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="Cora's shape, 30 iterations, 1 in 3")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.iterations, args.every = ["synthetic-cora"], 30, 3
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}, but torch sees no CUDA device", file=sys.stderr)
        return 2
    results: Dict[str, Any] = {}
    worst_share = worst_mean = 0.0
    for plat in args.platforms:
        for shape in args.shapes:
            label = f"{plat} {shape}"
            try:
                r = compare(plat, shape, args.iterations, args.every, device)
            except ImportError as exc:
                print(f"{label}: skipped ({exc})")
                continue
            except Exception as exc:  # noqa: BLE001 - PyPI's DGL has no CUDA
                if not (plat == "dgl" and device.type == "cuda"):
                    raise
                print(f"{label}: skipped ({type(exc).__name__}: {str(exc)[:80]})")
                continue
            results[label] = r
            s = r["sampling"]
            walls = ", ".join(f"{k} {v:.2f}" for k, v in r["wall_ms"].items())
            print(
                f"\n{label} on {device}: {args.iterations} iterations, B and B' one in "
                f"{args.every} (B recorded {s['recorded']} of {s['iterations']}); ms an "
                f"iteration: {walls}"
            )
            worst_share = max(
                worst_share,
                _table("row", ("A %", "B %", "B-A pt"), "pt", r["rows"], _points, 100),
            )
            layers = [dict(m, row=name) for name, m in r["layers"].items()]
            worst_mean = max(
                worst_mean,
                _table(
                    "layer, mean per call", ("A us", "B us", "B/A %"), "%", layers, _percent, 1e6
                ),
            )
    print(
        f"\nlargest difference, A to B: {worst_share:.2f} points of a share (goal 2), "
        f"{worst_mean:.2f}% of a layer's mean per call (goal 5)"
    )
    if args.json:
        launch_bound.DEVICE = device
        launch_bound.write_json(
            args.json,
            results,
            iterations=args.iterations,
            every=args.every,
            worst_share_points=worst_share,
            worst_mean_percent=worst_mean,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
