"""Where a GAT's memory goes: PyG's examples/gat.py model trained with memory recorded.

GATConv(features, hidden, heads) -> ELU -> GATConv(hidden * heads, classes, heads=1), dropout
0.6 on the inputs and the attention (PyG's examples/gat.py), Adam lr 0.005, on a graph of
Cora's shape (synthetic-cora: 2,708 nodes, 10,556 edges, 1,433 features, 7 classes) or
ogbn-arxiv's scaled down. After training it prints the memory table: what each step keeps
for backward per forward, and its peak (``configure(memory=True)``, docs/memory.md), and
one line to compare variants:

    python examples/gat_memory.py                      # heads 8, hidden 8
    python examples/gat_memory.py --heads 1 --hidden 64
    python examples/gat_memory.py --sparse             # a SparseTensor adj_t, not edge_index

The line: ``kept <bytes per forward> peak <the forward's peak> epoch <ms, memory on>``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import instrumented_convs as ic
from instrumented_convs.commands.study.data import load_graph, scaled_shape, synthetic_graph
from instrumented_convs.pyg import GATConv
from instrumented_convs.report.columns import bytes_text


class GAT(torch.nn.Module):
    """PyG's examples/gat.py model."""

    def __init__(self, features: int, hidden: int, classes: int, heads: int) -> None:
        super().__init__()
        self.conv1 = GATConv(features, hidden, heads, dropout=0.6)
        self.conv2 = GATConv(hidden * heads, classes, heads=1, concat=False, dropout=0.6)

    def forward(self, x: torch.Tensor, edges: object) -> torch.Tensor:
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edges))
        x = F.dropout(x, p=0.6, training=self.training)
        return self.conv2(x, edges)


def main() -> None:
    """Train, print the memory table and the summary line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--sparse", action="store_true", help="a SparseTensor adj_t (torch-sparse)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--dataset", default="synthetic-cora", help="synthetic-cora, synthetic-arxiv")
    p.add_argument("--scale", type=float, default=1.0, help="shrink a synthetic graph")
    p.add_argument("--depth", type=int, default=3, help="the table's rows down to this depth")
    args = p.parse_args()
    torch.manual_seed(0)
    if args.scale != 1.0:
        data = synthetic_graph(args.dataset, **scaled_shape(args.dataset, args.scale))
    else:
        data = load_graph(args.dataset)
    edges: object = data.edge_index
    if args.sparse:
        from torch_sparse import SparseTensor

        n = data.num_nodes
        edges = SparseTensor(row=data.edge_index[1], col=data.edge_index[0], sparse_sizes=(n, n))
    model = GAT(data.x.size(1), args.hidden, data.num_classes, args.heads)
    ic.name_layers(model)  # by layer: conv1, conv2
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    train = data.train_idx
    with ic.configure(memory=True):
        t0 = time.perf_counter()
        for _ in range(args.epochs):
            model.train()
            opt.zero_grad()
            with ic.region("forward"):
                out = model(data.x, edges)
            F.cross_entropy(out[train], data.y[train]).backward()
            opt.step()
        epoch = (time.perf_counter() - t0) / args.epochs
    summary = ic.registry.summary(by="layer")
    print(summary.select(max_depth=args.depth, phase="forward").table(memory=True))
    top = summary["forward"]
    print(
        f"kept {bytes_text(top.saved_bytes / top.count)} peak {bytes_text(top.peak_bytes)} "
        f"epoch {1e3 * epoch:.1f} ms (memory on; heads {args.heads}, hidden {args.hidden}, "
        f"{'SparseTensor' if args.sparse else 'edge_index'})"
    )


if __name__ == "__main__":
    main()
