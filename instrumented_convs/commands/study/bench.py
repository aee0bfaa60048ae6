"""What instrumentation costs a training epoch: stock layers vs instrumented, side by side.

The same model in several variants (:data:`VARIANTS`), timed in interleaved rounds so that
the machine's drifts hit all alike, with a second stock copy as the noise floor. Used by
``python -m instrumented_convs bench`` and ``benchmarks/overhead.py``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

import instrumented_convs as ic

from .data import SHAPES, GraphData, load_graph
from .models import build_model

__all__ = [
    "VARIANTS",
    "CASES",
    "measure_case",
    "training_epoch",
    "add_bench_arguments",
    "run_bench",
    "write_json",
]

#: The variants timed in each round, in order (the order alternates between rounds), each a
#: copy of the study's 3-layer GCN with the same weights: ``stock`` (torch_geometric.nn.GCNConv
#: / dgl.nn.GraphConv); ``enabled`` (our layers, recording forward and backward, NVTX on);
#: ``no backward`` (backward timing off: its difference to ``enabled`` is what timing the
#: backward costs); ``disabled`` (our layers inside ``configure(enabled=False)``); ``stock
#: again`` (a second stock copy: its ratio to ``stock`` is the noise floor, an A/A comparison).
VARIANTS = ("stock", "enabled", "no backward", "disabled", "stock again")
#: (platform, SparseTensor input, label) of each case.
CASES = (("pyg", False, "PyG edge_index"), ("pyg", True, "PyG SparseTensor"), ("dgl", False, "DGL"))
#: What each case needs installed: (module, pip name).
_NEEDS = {
    "PyG edge_index": (("torch_geometric", "torch-geometric"),),
    "PyG SparseTensor": (("torch_geometric", "torch-geometric"), ("torch_sparse", "torch-sparse")),
    "DGL": (("dgl", "dgl"),),
}


def training_epoch(model: torch.nn.Module, graph: Any, data: GraphData) -> Callable[[], None]:
    """One full-graph training step of ``model`` (Adam, NLL on the training nodes), as a call."""
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


def measure_case(
    data: GraphData,
    platform_: str,
    sparse: bool,
    rounds: int,
    warmup: int,
    hidden: int,
    device: torch.device,
) -> Dict[str, Any]:
    """Interleaved epochs of the variants; medians, IQRs and medians of per-round ratios.

    For one graph shape and input kind (PyG edge_index, PyG SparseTensor, DGL graph): after
    ``warmup``, one training epoch (zero_grad, forward, NLL loss, backward, Adam step) of each
    variant is timed in turn, A B C D E E D C B A ..., so drifts of the machine hit all alike;
    each variant's median epoch time and interquartile range, and the ratios to stock as the
    median of the per-round ratios. On CUDA the epoch is timed with CUDA events around it (a
    synchronize per epoch, outside the measured code).
    """
    torch.manual_seed(0)
    ours, graph = build_model(platform_, data, hidden=hidden, sparse=sparse)
    stock, _ = build_model(platform_, data, hidden=hidden, sparse=sparse, stock=True)
    stock.load_state_dict(ours.state_dict())
    torch.manual_seed(0)
    ours_off, _ = build_model(platform_, data, hidden=hidden, sparse=sparse)
    ours_off.load_state_dict(ours.state_dict())
    torch.manual_seed(0)
    ours_no_bw, _ = build_model(platform_, data, hidden=hidden, sparse=sparse)
    ours_no_bw.load_state_dict(ours.state_dict())
    stock2, _ = build_model(platform_, data, hidden=hidden, sparse=sparse, stock=True)
    stock2.load_state_dict(ours.state_dict())
    if platform_ == "dgl" or sparse:
        graph = graph.to(device)
    epochs = {
        "stock": training_epoch(stock.to(device), graph, data),
        "enabled": training_epoch(ours.to(device), graph, data),
        "no backward": training_epoch(ours_no_bw.to(device), graph, data),
        "disabled": training_epoch(ours_off.to(device), graph, data),
        "stock again": training_epoch(stock2.to(device), graph, data),
    }
    timed = _timer(device)

    def run(variant: str) -> float:
        if variant == "disabled":
            with ic.configure(enabled=False):
                return timed(epochs[variant])
        if variant == "no backward":
            with ic.configure(backward=False):
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


def add_bench_arguments(parser: argparse.ArgumentParser, default_shapes: Sequence[str]) -> None:
    """Add the benchmark's flags to an ``argparse`` parser."""
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=list(default_shapes),
        choices=sorted(SHAPES),
        metavar="SHAPE",
        help="generated graph shapes to time, any of: " + ", ".join(sorted(SHAPES)),
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        default=[c[2] for c in CASES],
        choices=[c[2] for c in CASES],
        metavar="CASE",
        help="the input kinds to time, any of: "
        + ", ".join(repr(c[2]) for c in CASES)
        + " (default: all)",
    )
    parser.add_argument(
        "--rounds", type=int, default=15, help="interleaved rounds (epochs per variant)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed epochs per variant first")
    parser.add_argument("--hidden", type=int, default=128, help="hidden layer width")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="tiny graph, 3 rounds: a smoke run")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")


def _missing(label: str, device: torch.device) -> Optional[str]:
    """Why the case cannot run here, or ``None``."""
    for module, pip_name in _NEEDS[label]:
        try:
            importlib.import_module(module)
        except ImportError:
            return f"needs {pip_name}, which is not installed"
    if label == "DGL" and device.type == "cuda":
        try:
            import dgl

            dgl.graph(([0], [0])).to(device)
        except Exception:
            return "this DGL build has no CUDA support"
    return None


def run_bench(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Run the cases ``args`` select, print a table row per case; return the results."""
    if args.quick:
        args.shapes, args.rounds, args.warmup = ["synthetic-quick"], 3, 1
    os.environ.setdefault("DGLBACKEND", "pytorch")
    device = torch.device(args.device)
    results: List[Dict[str, Any]] = []
    print(
        f"Training-epoch time, stock vs instrumented ({args.rounds} interleaved rounds after "
        f"{args.warmup} warm-up; NVTX backend {ic.configure().nvtx}; {device})"
    )
    print(
        f"  {'shape':16s} {'case':17s} {'stock ms (IQR)':>18s} {'enabled ms (IQR)':>18s} "
        f"{'no-bw ms (IQR)':>18s} {'disabled ms (IQR)':>18s} {'again ms (IQR)':>18s} "
        f"{'enabled/stock':>14s} "
        f"{'no-bw/stock':>12s} {'disabled/stock':>15s} {'again/stock':>12s}"
    )
    for shape in args.shapes:
        data = load_graph(shape).to(device)
        for platform_, sparse, label in CASES:
            if label not in args.cases:
                continue
            why = _missing(label, device)
            if why is not None:
                print(f"  {shape:16s} {label:17s} skipped: {why}")
                continue
            res = measure_case(
                data, platform_, sparse, args.rounds, args.warmup, args.hidden, device
            )
            m, q, r = res["median_s"], res["iqr_s"], res["ratio_median"]
            print(
                f"  {shape:16s} {label:17s} "
                + " ".join(f"{m[v] * 1e3:10.2f} ({q[v] * 1e3:5.2f})" for v in VARIANTS)
                + f" {r['enabled']:14.4f} {r['no backward']:12.4f} {r['disabled']:15.4f}"
                f" {r['stock again']:12.4f}",
                flush=True,
            )
            results.append({"shape": shape, "case": label, **res})
    if args.json:
        write_json(args.json, results, device)
    return results


def write_json(path: str, results: List[Dict[str, Any]], device: torch.device) -> None:
    """Write the results with the machine's versions to ``path``."""
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "nvtx_backend": ic.configure().nvtx,
        "cpu_count": os.cpu_count(),
    }
    with open(path, "w") as fh:
        json.dump({"info": info, "results": results}, fh, indent=2)
