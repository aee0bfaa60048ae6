"""The fixed cost instrumentation adds to one layer call, in microseconds.

An epoch benchmark (benchmarks/overhead.py) cannot resolve differences below its noise
floor (about +-0.5% of an epoch on a shared 2-core machine). This one measures the cost per
forward call of one layer directly: on a tiny graph (so the layer's own work is small and
steady) it times many calls of a stock layer, the instrumented layer enabled, and the
instrumented layer disabled, interleaved round by round, and subtracts. Multiply by the
layer calls of an epoch to get what instrumentation adds to it.

A fourth variant, ``no-op steps``, runs a detailed layer (GCNConv, GraphConv) with every one of its
step objects replaced by a do-nothing context manager: its difference to ``stock`` is the cost of
the instrumented forward's own structure (extra Python frames, the per-forward checks), and
``enabled`` minus ``no-op steps`` is the cost of the steps themselves. Generic layers (SAGEConv,
GATConv: wrappers, no copied code, see ``instrumented_convs.layers.generic``) have no such variant.
For DGL's generic layers a fifth, ``stock, DGL unwrapped``, runs the stock layer with DGL's own
functions put back (``dgl.generic.uninstall``): its difference to ``stock`` is what our wrappers of
``update_all`` and the kernels cost stock layers (one check each).

    python benchmarks/layer_cost.py [--calls 2000] [--rounds 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch

os.environ.setdefault("DGLBACKEND", "pytorch")

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.core.steps import step  # noqa: E402


class _NoOp:
    """A do-nothing context manager standing in for every step of a layer."""

    def __enter__(self) -> "_NoOp":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _noop_steps() -> Callable[[], None]:
    """Replace the layers' step objects with no-ops; return the function that undoes it."""
    import importlib

    noop = _NoOp()
    saved = []
    for modname in ("instrumented_convs.pyg", "instrumented_convs.dgl"):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for name, value in vars(mod).items():
            if isinstance(value, step.Step) or name == "step":
                saved.append((mod, name, value))
        for mod_, name, value in saved:
            if mod_ is mod:
                setattr(mod, name, noop if isinstance(value, step.Step) else (lambda *a, **k: noop))
    # the layer's own step comes from the layer contract
    from instrumented_convs.layers.contract import InstrumentedLayer

    saved.append((InstrumentedLayer, "_ic_step", InstrumentedLayer.__dict__["_ic_step"]))
    InstrumentedLayer._ic_step = lambda self, device: noop  # type: ignore[method-assign]

    def restore() -> None:
        for mod, name, value in saved:
            setattr(mod, name, value)

    return restore


def _cases() -> Dict[str, Dict[str, Callable[[], Any]]]:
    torch.manual_seed(0)
    n = 64
    x = torch.randn(n, 16)
    ei = torch.randint(0, n, (2, 256))
    cases: Dict[str, Dict[str, Callable[[], Any]]] = {}
    try:
        from torch_geometric.nn import GCNConv as Stock

        from instrumented_convs.pyg import GCNConv

        stock, ours = Stock(16, 16), GCNConv(16, 16)
        ours.load_state_dict(stock.state_dict())
        cases["PyG GCNConv, edge_index"] = {
            "stock": lambda: stock(x, ei),
            "ours": lambda: ours(x, ei),
        }
        from torch_geometric.nn import GATConv as PGATConv
        from torch_geometric.nn import SAGEConv as PSAGEConv

        from instrumented_convs.pyg import GATConv as OGATConv
        from instrumented_convs.pyg import SAGEConv as OSAGEConv

        for name, s_, o_ in (
            ("PyG SAGEConv, edge_index", PSAGEConv(16, 16), OSAGEConv(16, 16)),
            ("PyG GATConv, edge_index", PGATConv(16, 4, 4), OGATConv(16, 4, 4)),
        ):
            o_.load_state_dict(s_.state_dict())
            cases[name] = {
                "stock": lambda s_=s_: s_(x, ei),
                "ours": lambda o_=o_: o_(x, ei),
                "generic": True,
            }
        try:
            from torch_sparse import SparseTensor

            adj = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(n, n))
            cases["PyG GCNConv, SparseTensor"] = {
                "stock": lambda: stock(x, adj),
                "ours": lambda: ours(x, adj),
            }
        except ImportError:
            pass
    except ImportError:
        pass
    try:
        import dgl
        from dgl.nn import GraphConv as DStock

        from instrumented_convs.dgl import GraphConv

        g = dgl.add_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=n))
        dstock, dours = DStock(16, 16), GraphConv(16, 16)
        dours.load_state_dict(dstock.state_dict())
        cases["DGL GraphConv"] = {"stock": lambda: dstock(g, x), "ours": lambda: dours(g, x)}
        from dgl.nn import GATConv as DGATConv
        from dgl.nn import SAGEConv as DSAGEConv

        from instrumented_convs.dgl import GATConv as OGATConv
        from instrumented_convs.dgl import SAGEConv as OSAGEConv

        for name, s_, o_ in (
            ("DGL SAGEConv", DSAGEConv(16, 16, "mean"), OSAGEConv(16, 16, "mean")),
            ("DGL GATConv", DGATConv(16, 4, 4), OGATConv(16, 4, 4)),
        ):
            o_.load_state_dict(s_.state_dict())
            cases[name] = {
                "stock": lambda s_=s_: s_(g, x),
                "ours": lambda o_=o_: o_(g, x),
                "dgl": True,
            }
    except ImportError:
        pass
    return cases


def measure(fns: Dict[str, Callable[[], Any]], calls: int, rounds: int) -> Dict[str, float]:
    """Median microseconds per call of each variant, and medians of per-round differences."""

    def loop(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        return (time.perf_counter_ns() - t0) / calls / 1e3

    def disabled() -> float:
        with ic.configure(enabled=False):
            return loop(fns["ours"])

    def noop_steps() -> float:
        restore = _noop_steps()
        try:
            return loop(fns["ours"])
        finally:
            restore()

    def unwrapped() -> float:
        from instrumented_convs.dgl import generic as _dgl_generic

        _dgl_generic.uninstall()
        try:
            return loop(fns["stock"])
        finally:
            _dgl_generic.install()

    generic = fns.get("generic") or fns.get("dgl")
    variants = {
        "stock": lambda: loop(fns["stock"]),
        "enabled": lambda: loop(fns["ours"]),
        "disabled": disabled,
        "stock again": lambda: loop(fns["stock"]),
    }
    if not generic:
        variants["no-op steps"] = noop_steps
    if fns.get("dgl"):
        variants["stock, DGL unwrapped"] = unwrapped
    with torch.no_grad():
        for v in variants.values():
            v()
        samples: Dict[str, List[float]] = {k: [] for k in variants}
        for _ in range(rounds):
            for k, v in variants.items():
                samples[k].append(v())
            ic.registry.reset()
    med = {k: statistics.median(v) for k, v in samples.items()}
    diffs = {
        k: statistics.median([a - b for a, b in zip(samples[k], samples["stock"])])
        for k in samples
        if k != "stock"
    }
    nan = float("nan")
    return {
        "stock_us": med["stock"],
        "enabled_us": med["enabled"],
        "disabled_us": med["disabled"],
        "noop_steps_us": med.get("no-op steps", nan),
        "enabled_minus_stock_us": diffs["enabled"],
        "disabled_minus_stock_us": diffs["disabled"],
        "noop_steps_minus_stock_us": diffs.get("no-op steps", nan),
        "stock_minus_unwrapped_us": -diffs.get("stock, DGL unwrapped", nan),
        "aa_us": diffs["stock again"],
    }


def main(argv: List[str] = None) -> int:  # type: ignore[assignment]
    """Print (and optionally write) the per-call costs."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--calls", type=int, default=2000, help="layer calls per variant per round")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    out = {}
    print(
        f"Cost per layer forward call, microseconds (median of {args.rounds} rounds of "
        f"{args.calls} calls, "
        f"no_grad, NVTX backend {ic.configure().nvtx})"
    )
    print(
        "  (no-op steps: detailed layers only; wrapped-unwrapped: a stock DGL layer with and "
        "without our wrappers of DGL's functions; A/A: stock again minus stock, the noise floor)"
    )
    print(
        f"  {'layer':28s} {'stock':>8s} {'enabled':>8s} {'disabled':>9s} {'no-op steps':>12s} "
        f"{'enabled-stock':>14s} {'disabled-stock':>15s} {'no-op-stock':>12s} "
        f"{'wrapped-unwrapped':>18s} {'A/A':>6s}"
    )
    for name, fns in _cases().items():
        r = measure(fns, args.calls, args.rounds)
        out[name] = r
        print(
            f"  {name:28s} {r['stock_us']:8.1f} {r['enabled_us']:8.1f} {r['disabled_us']:9.1f} "
            f"{r['noop_steps_us']:12.1f} {r['enabled_minus_stock_us']:14.1f} "
            f"{r['disabled_minus_stock_us']:15.2f} {r['noop_steps_minus_stock_us']:12.1f} "
            f"{r['stock_minus_unwrapped_us']:18.2f} {r['aa_us']:6.1f}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
