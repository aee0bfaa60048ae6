"""What instrumentation costs a training epoch: stock layers vs instrumented, side by side.

For each graph shape (ogbn-arxiv's and Cora's, generated) and each input kind (PyG
edge_index, PyG SparseTensor, DGL graph), three copies of the seeds' 3-layer GCN with the
same weights:

- ``stock``: torch_geometric.nn.GCNConv / dgl.nn.GraphConv;
- ``enabled``: instrumented_convs' layers, recording, NVTX on (the nvtx package if installed);
- ``disabled``: instrumented_convs' layers with ``disable()``;
- ``stock again``: a second stock copy, timed like the others: its ratio to ``stock`` is the
  noise floor of the measurement (an A/A comparison).

After warm-up, one training epoch (zero_grad, forward, NLL loss, backward, Adam step) of
each is timed in turn, A B C A B C ..., so drifts of the machine hit all three alike. The
table gives each variant's median epoch time and interquartile range, and the ratios to
stock as the median of the per-round ratios. On CUDA the epoch is timed with CUDA events
around it (a synchronize per epoch, outside the measured code).

    python benchmarks/overhead.py                         # CPU, arxiv and Cora shapes
    python benchmarks/overhead.py --device cuda --json out.json
    python benchmarks/overhead.py --quick                 # a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

os.environ.setdefault("DGLBACKEND", "pytorch")

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.study import SHAPES, build_model, load_graph  # noqa: E402

VARIANTS = ("stock", "enabled", "disabled", "stock again")
CASES = (("pyg", False, "PyG edge_index"), ("pyg", True, "PyG SparseTensor"), ("dgl", False, "DGL"))


def _epoch_fn(model: torch.nn.Module, graph: Any, data: Any) -> Callable[[], None]:
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def epoch() -> None:
        opt.zero_grad()
        out = model(data.x, graph)
        F.nll_loss(out[data.train_idx], data.y[data.train_idx]).backward()
        opt.step()

    return epoch


def _timer(device: torch.device) -> Callable[[Callable[[], None]], float]:
    if device.type == "cuda":
        def timed(fn: Callable[[], None]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def timed(fn: Callable[[], None]) -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
    return timed


def _iqr(xs: List[float]) -> float:
    if len(xs) < 4:
        return max(xs) - min(xs)
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def measure_case(data: Any, platform_: str, sparse: bool, rounds: int, warmup: int, hidden: int,
                 device: torch.device) -> Dict[str, Any]:
    """Interleaved epochs of the three variants; medians, IQRs and ratio medians."""
    torch.manual_seed(0)
    ours, graph = build_model(platform_, data, hidden=hidden, sparse=sparse)
    stock, _ = build_model(platform_, data, hidden=hidden, sparse=sparse, stock=True)
    stock.load_state_dict(ours.state_dict())
    torch.manual_seed(0)
    ours_off, _ = build_model(platform_, data, hidden=hidden, sparse=sparse)
    ours_off.load_state_dict(ours.state_dict())
    stock2, _ = build_model(platform_, data, hidden=hidden, sparse=sparse, stock=True)
    stock2.load_state_dict(ours.state_dict())
    if platform_ == "dgl":
        graph = graph.to(device)
    elif sparse:
        graph = graph.to(device)
    epochs = {"stock": _epoch_fn(stock.to(device), graph, data),
              "enabled": _epoch_fn(ours.to(device), graph, data),
              "disabled": _epoch_fn(ours_off.to(device), graph, data),
              "stock again": _epoch_fn(stock2.to(device), graph, data)}
    timed = _timer(device)

    def run(variant: str) -> float:
        if variant == "disabled":
            with ic.disabled():
                return timed(epochs[variant])
        return timed(epochs[variant])

    for _ in range(warmup):
        for v in VARIANTS:
            run(v)
    times: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))  # alternate the order too
        for v in order:
            times[v].append(run(v))
    ratios = {v: [t / s for t, s in zip(times[v], times["stock"])] for v in VARIANTS[1:]}
    ic.registry.reset()
    return {
        "median_s": {v: statistics.median(times[v]) for v in VARIANTS},
        "iqr_s": {v: _iqr(times[v]) for v in VARIANTS},
        "ratio_median": {v: statistics.median(ratios[v]) for v in ratios},
        "ratio_iqr": {v: _iqr(ratios[v]) for v in ratios},
        "rounds": rounds,
    }


def main(argv: List[str] = None) -> int:  # type: ignore[assignment]
    """Run the cases, print the table, optionally write JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["synthetic-arxiv", "synthetic-cora"], choices=sorted(SHAPES))
    p.add_argument("--cases", nargs="+", default=[c[2] for c in CASES], choices=[c[2] for c in CASES],
                   metavar="CASE", help="any of: " + ", ".join(repr(c[2]) for c in CASES))
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (epochs per variant)")
    p.add_argument("--warmup", type=int, default=2, help="untimed epochs per variant first")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="tiny graph, 3 rounds: a smoke run")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.rounds, args.warmup = ["synthetic-quick"], 3, 1
    device = torch.device(args.device)
    results = []
    print(f"Training-epoch time, stock vs instrumented ({args.rounds} interleaved rounds after "
          f"{args.warmup} warm-up; NVTX backend {ic.nvtx_backend()}; {device})")
    print(f"  {'shape':16s} {'case':17s} {'stock ms (IQR)':>18s} {'enabled ms (IQR)':>18s} "
          f"{'disabled ms (IQR)':>18s} {'again ms (IQR)':>18s} {'enabled/stock':>14s} {'disabled/stock':>15s} "
          f"{'again/stock':>12s}")
    for shape in args.shapes:
        data = load_graph(shape).to(device)
        for platform_, sparse, label in CASES:
            if label not in args.cases:
                continue
            if platform_ == "dgl" and device.type == "cuda":
                try:
                    import dgl

                    dgl.graph(([0], [0])).to(device)
                except Exception:
                    print(f"  {shape:16s} {label:17s} skipped: this DGL build has no CUDA support")
                    continue
            res = measure_case(data, platform_, sparse, args.rounds, args.warmup, args.hidden, device)
            m, q, r = res["median_s"], res["iqr_s"], res["ratio_median"]
            print(f"  {shape:16s} {label:17s} "
                  + " ".join(f"{m[v] * 1e3:10.2f} ({q[v] * 1e3:5.2f})" for v in VARIANTS)
                  + f" {r['enabled']:14.4f} {r['disabled']:15.4f} {r['stock again']:12.4f}", flush=True)
            results.append({"shape": shape, "case": label, **res})
    if args.json:
        info = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device),
                "nvtx_backend": ic.nvtx_backend(), "cpu_count": os.cpu_count()}
        with open(args.json, "w") as fh:
            json.dump({"info": info, "results": results}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
