"""A heterogeneous GNN on OGB-MAG's shape, its time by relation: PyG's ``to_hetero`` and DGL's
``HeteroGraphConv``, each with the one import changed.

The graph is generated in OGB-MAG's shape, scaled down (papers, authors, institutions and
fields of study; ``writes``, ``cites``, ``affiliated_with``, ``has_topic`` and the reverses of
the three between types: 7 relations), with paper features and venue labels; nothing is
downloaded. The model is two GraphSAGE layers (mean aggregation, hidden 64), made
heterogeneous by ``to_hetero`` in PyG (a copy of each layer per relation, summed per
destination type) and by ``HeteroGraphConv`` in DGL (the same), trained full-batch with Adam
on the papers' labels. Every type without features gets a learned embedding.

It prints the table by relation: each relation's layers added together, the time of the
glue between them in the model's own row (``summary(by="relation")``; ``--by layer`` or
``--by step`` for the others).

    python examples/hetero.py                           # both frameworks, 20 epochs
    python examples/hetero.py --platform pyg --epochs 5 --by layer
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Tuple

import torch
import torch.nn.functional as F

from instrumented_convs import region, registry

#: Node types and their counts (OGB-MAG's proportions, about 1/200 of its size).
NODES = {"paper": 3_700, "author": 5_500, "institution": 45, "field_of_study": 300}
#: Relations and their edge counts (OGB-MAG's proportions, the same scale).
EDGES = {
    ("author", "writes", "paper"): 35_000,
    ("paper", "cites", "paper"): 27_000,
    ("author", "affiliated_with", "institution"): 5_000,
    ("paper", "has_topic", "field_of_study"): 36_000,
}
FEATURES, HIDDEN, CLASSES = 128, 64, 32


def graph(seed: int = 0) -> Tuple[Dict[str, int], Dict[Tuple[str, str, str], torch.Tensor]]:
    """The node counts and each relation's edges (source row, destination row), the three
    between two types also reversed (``rev_writes``...)."""
    g = torch.Generator().manual_seed(seed)
    edges = {}
    for (src, rel, dst), n in EDGES.items():
        ei = torch.stack(
            [
                torch.randint(0, NODES[src], (n,), generator=g),
                torch.randint(0, NODES[dst], (n,), generator=g),
            ]
        )
        edges[src, rel, dst] = ei
        if src != dst:
            edges[dst, f"rev_{rel}", src] = ei.flip(0)
    return NODES, edges


def features(seed: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """The papers' features and labels."""
    g = torch.Generator().manual_seed(seed)
    n = NODES["paper"]
    return torch.randn(n, FEATURES, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


class Embeddings(torch.nn.Module):
    """The papers' features as they are; a learned embedding for every other type."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.ParameterDict(
            {t: torch.nn.Parameter(torch.randn(n, FEATURES) * 0.1) for t, n in NODES.items()}
        )

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {t: (x if t == "paper" else e) for t, e in self.emb.items()}


def train(model: torch.nn.Module, call, y: torch.Tensor, epochs: int) -> float:
    """Full-batch training on the papers' labels, in regions; the last loss."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss = torch.zeros(())
    for _ in range(epochs):
        opt.zero_grad()
        with region("forward"):
            out = call()
        with region("loss"):
            loss = F.cross_entropy(out, y)
        with region("backward"):
            loss.backward()
        with region("optimizer.step"):
            opt.step()
    return float(loss)


def pyg(epochs: int) -> float:
    """``to_hetero`` of a GraphSAGE built from ``instrumented_convs.pyg``."""
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import to_hetero

    from instrumented_convs.pyg import SAGEConv  # instead of torch_geometric.nn's

    class GNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = SAGEConv((-1, -1), HIDDEN)
            self.conv2 = SAGEConv((-1, -1), CLASSES)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    nodes, edges = graph()
    data = HeteroData()
    for t, n in nodes.items():
        data[t].num_nodes = n
    for rel, ei in edges.items():
        data[rel].edge_index = ei
    x, y = features()
    torch.manual_seed(0)
    emb = Embeddings()
    gnn = to_hetero(GNN(), data.metadata(), aggr="sum")
    with torch.no_grad():
        gnn(emb(x), data.edge_index_dict)  # (lazy shapes)
    model = torch.nn.ModuleDict({"emb": emb, "gnn": gnn})
    return train(model, lambda: gnn(emb(x), data.edge_index_dict)["paper"], y, epochs)


def dgl(epochs: int) -> float:
    """DGL's ``HeteroGraphConv`` of GraphSAGE layers, all from ``instrumented_convs.dgl``."""
    os.environ.setdefault("DGLBACKEND", "pytorch")
    import dgl as dgl_

    from instrumented_convs.dgl import HeteroGraphConv, SAGEConv  # instead of dgl.nn's

    nodes, edges = graph()
    g = dgl_.heterograph({rel: (ei[0], ei[1]) for rel, ei in edges.items()}, nodes)
    rels = [rel for _, rel, _ in g.canonical_etypes]

    class GNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = HeteroGraphConv(
                {r: SAGEConv(FEATURES, HIDDEN, "mean") for r in rels}, aggregate="sum"
            )
            self.conv2 = HeteroGraphConv(
                {r: SAGEConv(HIDDEN, CLASSES, "mean") for r in rels}, aggregate="sum"
            )

        def forward(self, g, x):
            h = {t: v.relu() for t, v in self.conv1(g, x).items()}
            return self.conv2(g, {t: h.get(t, x[t][:, :HIDDEN]) for t in x})

    x, y = features()
    torch.manual_seed(0)
    emb, gnn = Embeddings(), GNN()
    model = torch.nn.ModuleDict({"emb": emb, "gnn": gnn})
    return train(model, lambda: gnn(g, emb(x))["paper"], y, epochs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--platform", choices=("pyg", "dgl", "both"), default="both")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--by", choices=("relation", "layer", "step"), default="relation")
    args = p.parse_args(argv)
    for name, fn in (("pyg", pyg), ("dgl", dgl)):
        if args.platform not in (name, "both"):
            continue
        registry.reset()
        loss = fn(args.epochs)
        print(f"{'PyG to_hetero' if name == 'pyg' else 'DGL HeteroGraphConv'}: loss {loss:.4f}")
        depth = 2 if name == "pyg" else 3  # (DGL: a relation is a step inside the layer's loop)
        print(registry.summary(by=args.by).select(max_depth=depth))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
