"""What instrumentation costs a heterogeneous model where an epoch is launch-bound.

A ``to_hetero`` model of a 2-layer SAGE GNN over 3 relations (two node types of 256 nodes,
1,024 edges a relation, 32 features, hidden 32, 7 classes on one node type): six conv calls
and the sums across relations a forward, at the size where an epoch is almost all Python and
dispatch (``launch_bound.py``'s), full training steps (zero_grad, forward, nll_loss, backward,
Adam step), one thread.

Variants, each its own copy of the model with the same weights, timed in interleaved rounds
(the order reversed every other round), a block of ``--block`` epochs per timing:

- ``stock``: ``to_hetero`` of PyG's layers;
- ``import swap``: ``to_hetero`` of ``instrumented_convs.pyg``'s (copies named by relation);
- ``instrument()``: ``to_hetero`` of PyG's, then ``instrument(model)``;
- ``stock again``: a second stock copy, the noise floor (A/A).

Reported: each variant's median epoch, the medians of per-round ratios to stock, the rows
recorded per epoch and the cost per row, (variant - stock) / rows, in microseconds.

    python benchmarks/hetero_cost.py                     # 200 rounds
    python benchmarks/hetero_cost.py --quick             # a smoke run (CI)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
from typing import Any, Callable, Dict, List

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bound as lb  # noqa: E402

import instrumented_convs as ic  # noqa: E402

VARIANTS = ("stock", "import swap", "instrument()", "stock again")
RELATIONS = (("a", "to", "b"), ("b", "rev", "a"), ("b", "near", "b"))


def _data() -> Any:
    from torch_geometric.data import HeteroData

    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    for t in ("a", "b"):
        data[t].x = torch.randn(lb.NODES, lb.FEATURES, generator=g)
    data["b"].y = torch.randint(0, lb.CLASSES, (lb.NODES,), generator=g)
    for rel in RELATIONS:
        data[rel].edge_index = torch.randint(0, lb.NODES, (2, lb.EDGES), generator=g)
    return data


def _gnn(module: Any) -> torch.nn.Module:
    class GNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = module.SAGEConv((-1, -1), lb.HIDDEN)
            self.conv2 = module.SAGEConv((-1, -1), lb.CLASSES)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    return GNN()


def models(data: Any) -> Dict[str, torch.nn.Module]:
    """One ``to_hetero`` model per variant, all with the weights of the first."""
    import torch_geometric.nn as stock_nn
    from torch_geometric.nn import to_hetero

    import instrumented_convs.pyg as ours_nn

    inputs = (data.x_dict, data.edge_index_dict)
    out: Dict[str, torch.nn.Module] = {}
    for v in VARIANTS:
        torch.manual_seed(1)
        m = to_hetero(_gnn(ours_nn if v == "import swap" else stock_nn), data.metadata())
        with torch.no_grad(), ic.configure(enabled=False):
            m(*inputs)  # (lazy shapes)
        if v == "instrument()":
            ic.instrument(m)
        out[v] = m
    state = copy.deepcopy(out["stock"].state_dict())
    for m in out.values():
        m.load_state_dict(state)
    return out


def _epoch(model: torch.nn.Module, data: Any) -> Callable[[], None]:
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    inputs, y = (data.x_dict, data.edge_index_dict), data["b"].y

    def epoch() -> None:
        opt.zero_grad()
        F.nll_loss(F.log_softmax(model(*inputs)["b"], -1), y).backward()
        opt.step()

    return epoch


def measure(rounds: int, warmup: int) -> Dict[str, Any]:
    """Interleaved epochs of every variant; medians, ratios to stock, rows and cost per row."""
    data = _data()
    epochs = {v: _epoch(m, data) for v, m in models(data).items()}
    ic.registry.reset()
    times = lb._interleave(
        {v: (lambda e=e: lb._timed(e)) for v, e in epochs.items()}, rounds, warmup
    )
    fwd, bwd = lb._rows_per_epoch(epochs["import swap"])
    medians = {v: statistics.median(t) for v, t in times.items()}
    ratios = {
        v: statistics.median(a / s for a, s in zip(times[v], times["stock"])) for v in VARIANTS
    }
    rows = fwd + bwd
    per_row = {v: (medians[v] - medians["stock"]) / rows for v in VARIANTS if v != "stock"}
    return {
        "rounds": rounds,
        "median_us": medians,
        "ratio": ratios,
        "rows": rows,
        "per_row_us": per_row,
    }


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--block", type=int, default=lb.BLOCK, help="epochs per timing")
    p.add_argument("--quick", action="store_true", help="a smoke run: 4 rounds of 2 epochs")
    p.add_argument("--json", metavar="FILE", help="write the figures here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    lb.BLOCK = 2 if args.quick else args.block
    result = measure(4 if args.quick else args.rounds, 1 if args.quick else args.warmup)
    result["machine"] = f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    print(f"to_hetero SAGE, 3 relations, launch-bound ({result['rounds']} rounds of {lb.BLOCK}):")
    print(f"  {'variant':14} {'epoch us':>10} {'x stock':>8} {'us/row':>7}")
    for v in VARIANTS:
        cost = result["per_row_us"].get(v)
        print(
            f"  {v:14} {result['median_us'][v]:10.1f} {result['ratio'][v]:8.3f} "
            + (f"{cost:7.2f}" if cost is not None else f"{'':7}")
        )
    print(f"  rows recorded per epoch: {result['rows']} (forward and backward calls of steps)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
