"""A small demo: a 3-layer GCN written in plain torch, timed with region() and step().

It runs anywhere (CPU or GPU, no PyG or DGL needed) and prints the epoch-level and per-step
tables. The instrumented PyG and DGL layers (``instrumented_convs.pyg.GCNConv``,
``instrumented_convs.dgl.GraphConv``) record the same kind of steps without any code change.

    python examples/demo.py [--nodes 2708] [--edges 10556] [--epochs 20] [--device cpu]
"""
from __future__ import annotations

import argparse
import logging

import torch
import torch.nn.functional as F

from instrumented_convs import region, registry, step

logger = logging.getLogger("demo")


class TinyGCNConv(torch.nn.Module):
    """A GCN layer (symmetric normalisation with self-loops) with its steps marked."""

    def __init__(self, in_channels: int, out_channels: int, name: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, out_channels, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(out_channels))
        self.name = name

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        with step("TinyGCNConv", scope=self.name, device=x.device):
            n = x.size(0)
            with step("gcn_norm"):
                with step("add_self_loops"):
                    loops = torch.arange(n, device=x.device)
                    row = torch.cat([edge_index[0], loops])
                    col = torch.cat([edge_index[1], loops])
                with step("degree"):
                    deg = torch.zeros(n, device=x.device).scatter_add_(0, col, torch.ones_like(col, dtype=x.dtype))
                    dinv = deg.pow(-0.5)
                    norm = dinv[row] * dinv[col]
            with step("lin"):
                x = self.lin(x)
            with step("propagate"):
                with step("message"):
                    msg = x[row] * norm.unsqueeze(-1)
                with step("aggregate"):
                    out = torch.zeros_like(x).index_add_(0, col, msg)
            with step("bias"):
                out = out + self.bias
            return out


class Net(torch.nn.Module):
    """in -> hidden -> hidden -> classes, ReLU between, log_softmax at the end."""

    def __init__(self, in_channels: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList([
            TinyGCNConv(in_channels, hidden, "convs.0"),
            TinyGCNConv(hidden, hidden, "convs.1"),
            TinyGCNConv(hidden, classes, "convs.2"),
        ])

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for conv in self.convs[:-1]:
            x = F.relu(conv(x, edge_index))
        return F.log_softmax(self.convs[-1](x, edge_index), dim=-1)


def main() -> None:
    """Train for a few epochs on a random graph and print both tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2708, help="number of nodes (default: Cora's 2708)")
    p.add_argument("--edges", type=int, default=10556, help="number of directed edges (default: Cora's 10556)")
    p.add_argument("--features", type=int, default=1433, help="input feature size (default: Cora's 1433)")
    p.add_argument("--classes", type=int, default=7, help="number of classes (default: Cora's 7)")
    p.add_argument("--hidden", type=int, default=128, help="hidden channels")
    p.add_argument("--epochs", type=int, default=20, help="training epochs")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    x = torch.randn(args.nodes, args.features, device=dev)
    edge_index = torch.randint(0, args.nodes, (2, args.edges), device=dev)
    y = torch.randint(0, args.classes, (args.nodes,), device=dev)
    model = Net(args.features, args.hidden, args.classes).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    for _ in range(args.epochs):
        opt.zero_grad()
        with region("forward"):
            out = model(x, edge_index)
        with region("loss"):
            loss = F.nll_loss(out, y)
        with region("backward"):
            loss.backward()
        with region("optimizer.step"):
            opt.step()
    logger.info("final loss %.4f after %d epochs on %d nodes / %d edges (%s)",
                loss.item(), args.epochs, args.nodes, args.edges, dev)
    summary = registry.summary()
    print(summary.select(max_depth=0).table(title="Epoch phases"))
    print()
    print(summary.select("forward").table(title="Steps inside forward"))


if __name__ == "__main__":
    main()
