"""Several data loaders in one training script, for the loaders' shares (tests/test_loaders.py):
a training loader and an evaluation one, a third iterated inside the training loop (nested),
or the training loader made anew every epoch. PyG's ``DataLoader`` over small generated
graphs (collated: its own work), or DGL's ``DataLoader`` with a neighbour sampler on one
generated graph (sampled: its own work); stock layers, which ``run`` instruments.

    python tests/scripts/loaders_many.py --platform pyg --loaders 3 [--per-epoch] [--workers 2]

Prints each epoch's mean loss.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

EPOCHS = 3


def pyg_parts(args: argparse.Namespace) -> tuple:
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader
    from torch_geometric.nn import GCNConv, global_mean_pool

    g = torch.Generator().manual_seed(0)
    data = [
        Data(
            x=torch.randn(40, 8, generator=g),
            edge_index=torch.randint(0, 40, (2, 160), generator=g),
            y=torch.tensor([i % 2]),
        )
        for i in range(96)
    ]

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.out = GCNConv(8, 16), GCNConv(16, 16), torch.nn.Linear(16, 2)

        def forward(self, batch: object) -> torch.Tensor:
            x = F.relu(self.a(batch.x, batch.edge_index))
            x = F.relu(self.b(x, batch.edge_index))
            return self.out(global_mean_pool(x, batch.batch))

    def loader(part: slice, shuffle: bool) -> object:
        return DataLoader(
            data[part], batch_size=16, shuffle=shuffle, num_workers=args.workers, generator=g
        )

    return Net(), loader, lambda batch: batch.y


def dgl_parts(args: argparse.Namespace) -> tuple:
    import dgl
    from dgl.nn import GraphConv

    g = torch.Generator().manual_seed(0)
    n = 400
    graph = dgl.graph(tuple(torch.randint(0, n, (2, 2000), generator=g)), num_nodes=n)
    graph = dgl.add_self_loop(graph)
    graph.ndata["feat"] = torch.randn(n, 8, generator=g)
    graph.ndata["label"] = torch.randint(0, 2, (n,), generator=g)
    sampler = dgl.dataloading.NeighborSampler(
        [5, 5], prefetch_node_feats=["feat"], prefetch_labels=["label"]
    )

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = GraphConv(8, 16), GraphConv(16, 2)

        def forward(self, batch: object) -> torch.Tensor:
            _, _, blocks = batch
            x = F.relu(self.a(blocks[0], blocks[0].srcdata["feat"]))
            return self.b(blocks[1], x)

    def loader(part: slice, shuffle: bool) -> object:
        ids = torch.arange(n)[part]
        return dgl.dataloading.DataLoader(
            graph, ids, sampler, batch_size=32, shuffle=shuffle, num_workers=args.workers
        )

    return Net(), loader, lambda batch: batch[2][-1].dstdata["label"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--platform", choices=["pyg", "dgl"], default="pyg")
    p.add_argument("--loaders", type=int, choices=[2, 3], default=2)
    p.add_argument("--per-epoch", action="store_true", help="a new training loader each epoch")
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(0)
    model, make, target = (pyg_parts if args.platform == "pyg" else dgl_parts)(args)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train = make(slice(0, None, 2), True)
    val = make(slice(1, None, 4), False)
    extra = make(slice(3, None, 4), False) if args.loaders == 3 else None
    for epoch in range(EPOCHS):
        if args.per_epoch:
            train = make(slice(0, None, 2), True)
        model.train()
        losses = []
        for i, batch in enumerate(train):
            opt.zero_grad()
            loss = F.cross_entropy(model(batch), target(batch))
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if extra is not None and i % 2 == 0:  # nested: another loader inside the loop
                with torch.no_grad():
                    for aside in extra:
                        model(aside)
                        break
        model.eval()
        with torch.no_grad():
            for batch in val:
                model(batch)
        print(f"epoch {epoch} {sum(losses) / len(losses):.6f}")


if __name__ == "__main__":
    main()
