"""Graph-level training over a PyG DataLoader with worker processes, the batches copied to
the device: for the workers' tests (tests/test_workers.py) and the GPU run (scripts/gpu.sh).

    python tests/scripts/loader_training.py [--device cuda] [--workers 2] [--epochs 3]

Each batch of small generated graphs is collated in a worker, pinned (``pin_memory`` on
CUDA: torch's pin-memory thread), copied with ``batch.to(device, non_blocking=True)``, and
trains a 2-layer GCN (stock ``torch_geometric.nn.GCNConv``; ``run`` instruments it). Prints
each epoch's mean loss.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv, global_mean_pool


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = GCNConv(16, 32), GCNConv(32, 32)
        self.out = torch.nn.Linear(32, 3)

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor
    ) -> torch.Tensor:
        x = F.relu(self.a(x, edge_index))
        x = F.relu(self.b(x, edge_index))
        return self.out(global_mean_pool(x, batch))


def graphs(n: int) -> list:
    """``n`` random graphs of 60 nodes and 240 edges, a class each."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        x = torch.randn(60, 16, generator=g)
        edge_index = torch.randint(0, 60, (2, 240), generator=g)
        out.append(Data(x=x, edge_index=edge_index, y=torch.tensor([i % 3])))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    device = torch.device(a.device)
    loader = DataLoader(
        graphs(192),
        batch_size=16,
        shuffle=True,
        num_workers=a.workers,
        persistent_workers=a.workers > 0,
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(1),
    )
    model = Net().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(a.epochs):
        total = 0.0
        for batch in loader:
            batch = batch.to(device, non_blocking=True)
            opt.zero_grad()
            loss = F.cross_entropy(model(batch.x, batch.edge_index, batch.batch), batch.y)
            loss.backward()
            opt.step()
            total += float(loss.detach())
        print(f"epoch {epoch} loss {total / len(loader):.6f}", flush=True)


if __name__ == "__main__":
    main()
