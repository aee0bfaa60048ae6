"""The study's data: generated graphs of the real datasets' shapes (:func:`synthetic_graph`,
:data:`SHAPES`), so that the study runs anywhere, and the real datasets from disk where they
are (:func:`load_graph`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch
from torch import Tensor

__all__ = [
    "SHAPES",
    "scaled_shape",
    "GraphData",
    "synthetic_graph",
    "DatasetNotFound",
    "MissingDependency",
    "load_graph",
]

#: Shapes of the study's datasets. ``num_edges`` counts directed edges before symmetrising
#: for arxiv (as ogbn-arxiv stores them), and after for Cora (as Planetoid stores them) and
#: products (61,859,140 undirected edges, 123,718,280 directed: ogbn-products' shape).
SHAPES: Dict[str, Dict[str, Any]] = {
    "synthetic-arxiv": dict(
        num_nodes=169_343,
        num_edges=1_166_243,
        symmetric_count=False,
        num_features=128,
        num_classes=40,
        split=(90_941, 29_799, 48_603),
    ),
    "synthetic-products": dict(
        num_nodes=2_449_029,
        num_edges=123_718_280,
        symmetric_count=True,
        num_features=100,
        num_classes=47,
        split=(196_615, 39_323, 2_213_091),
    ),
    "synthetic-cora": dict(
        num_nodes=2_708,
        num_edges=10_556,
        symmetric_count=True,
        num_features=1_433,
        num_classes=7,
        split=(140, 500, 1_000),
    ),
    "synthetic-quick": dict(
        num_nodes=1_000,
        num_edges=6_000,
        symmetric_count=False,
        num_features=16,
        num_classes=5,
        split=(500, 200, 300),
    ),
}

#: The fewest nodes, and nodes per split part, of a shape shrunk by :func:`scaled_shape`.
MIN_NODES, MIN_SPLIT = 64, 4


def scaled_shape(name: str, scale: float) -> Dict[str, Any]:
    """The shape ``SHAPES[name]`` with its nodes, edges and split sizes multiplied by ``scale``.

    The mean degree stays that of the full shape, so a sampled mini-batch costs about what it
    costs on the full graph. At least :data:`MIN_NODES` nodes and :data:`MIN_SPLIT` nodes per
    split part; edges are capped at a quarter of the possible pairs (a tiny scale of a dense
    shape cannot keep its degree). ``scale=1`` returns the shape unchanged.
    """
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose one of {sorted(SHAPES)}")
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], not {scale}")
    shape = dict(SHAPES[name])
    if scale == 1:
        return shape
    n = max(MIN_NODES, round(shape["num_nodes"] * scale))
    edges = min(max(2, round(shape["num_edges"] * scale)), n * (n - 1) // 4)
    if shape["symmetric_count"]:
        edges -= edges % 2  # both directions of each undirected edge
    parts = [max(MIN_SPLIT, round(part * scale)) for part in shape["split"]]
    while sum(parts) > n:  # the minimum sizes overshoot a tiny graph: shrink the largest part
        parts[parts.index(max(parts))] -= sum(parts) - n
    shape.update(num_nodes=n, num_edges=edges, split=tuple(parts))
    return shape


@dataclass
class GraphData:
    """A node-classification graph: features, labels, symmetric edges and a split."""

    name: str
    x: Tensor
    y: Tensor
    edge_index: Tensor
    train_idx: Tensor
    valid_idx: Tensor
    test_idx: Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return self.x.size(0)

    @property
    def num_edges(self) -> int:
        """Number of directed edges (both directions of each undirected edge)."""
        return self.edge_index.size(1)

    def to(self, device: Any) -> "GraphData":
        """A copy on ``device``."""
        return GraphData(
            self.name,
            self.x.to(device),
            self.y.to(device),
            self.edge_index.to(device),
            self.train_idx.to(device),
            self.valid_idx.to(device),
            self.test_idx.to(device),
            self.num_classes,
        )

    def describe(self) -> str:
        """One line: name, nodes, edges, features, classes, split sizes."""
        return (
            f"{self.name}: {self.num_nodes:,} nodes, {self.num_edges:,} directed edges, "
            f"{self.x.size(1)} features, {self.num_classes} classes, split "
            f"{len(self.train_idx):,}/{len(self.valid_idx):,}/{len(self.test_idx):,}"
        )


def _unique_pairs(src: Tensor, dst: Tensor, n: int) -> Tensor:
    keep = src != dst
    key = torch.unique(src[keep] * n + dst[keep])
    return key


def synthetic_graph(
    name: str,
    num_nodes: int,
    num_edges: int,
    num_features: int,
    num_classes: int,
    split: Tuple[int, int, int],
    symmetric_count: bool = False,
    homophily: float = 0.6,
    signal: float = 1.2,
    seed: int = 0,
) -> GraphData:
    """A graph of the given shape whose labels are learnable; deterministic given ``seed``.

    Each node gets a class; its features are a class centroid scaled so that two centroids
    lie about ``signal`` noise units apart, plus unit Gaussian noise (features alone are weak
    evidence, whatever the feature count); each edge starts at a uniform node
    and ends, with probability ``homophily``, at a node of the same class, else anywhere.
    Averaging over neighbours (what a GCN does) therefore sharpens the class signal. Edges
    are unique, without self-loops, and made symmetric. With ``symmetric_count`` the final
    (symmetric) edge count is ``num_edges``; otherwise ``num_edges`` directed edges are
    drawn first and then symmetrised, as ogbn-arxiv's are by ``to_undirected``.
    """
    g = torch.Generator().manual_seed(seed)
    n = num_nodes
    y = torch.randint(0, num_classes, (n,), generator=g)
    centroids = torch.randn(num_classes, num_features, generator=g)
    x = (signal / num_features**0.5) * centroids[y] + torch.randn(n, num_features, generator=g)

    order = torch.argsort(y)
    counts = torch.bincount(y, minlength=num_classes)
    starts = torch.cumsum(counts, 0) - counts
    target = num_edges // 2 if symmetric_count else num_edges
    keys = torch.empty(0, dtype=torch.long)
    while keys.numel() < target:
        m = int((target - keys.numel()) * 1.2) + 16
        src = torch.randint(0, n, (m,), generator=g)
        same = torch.rand(m, generator=g) < homophily
        cls = y[src]
        within = order[
            starts[cls]
            + (torch.rand(m, generator=g) * counts[cls]).long().clamp_max(counts[cls] - 1)
        ]
        dst = torch.where(same, within, torch.randint(0, n, (m,), generator=g))
        if symmetric_count:  # draw undirected pairs once: canonical order
            src, dst = torch.minimum(src, dst), torch.maximum(src, dst)
        keys = torch.unique(torch.cat([keys, _unique_pairs(src, dst, n)]))
    keys = keys[torch.randperm(keys.numel(), generator=g)[:target]]
    src, dst = keys // n, keys % n
    both = torch.unique(torch.cat([src * n + dst, dst * n + src]))
    edge_index = torch.stack([both // n, both % n])

    perm = torch.randperm(n, generator=g)
    a, b, c = split
    return GraphData(
        name, x, y, edge_index, perm[:a], perm[a : a + b], perm[a + b : a + b + c], num_classes
    )


class DatasetNotFound(FileNotFoundError):
    """The real dataset is not on disk (no network here to download it)."""


class MissingDependency(ImportError):
    """An optional package the requested run needs is not installed; the message says which."""


_HOW_TO_GET = {
    "ogbn-arxiv": (
        "ogbn-arxiv is not under {root!r} (looked for {path!r}). This machine cannot download "
        "it. On a machine with network access run:\n"
        "    pip install ogb\n"
        '    python -c "from ogb.nodeproppred import PygNodePropPredDataset as D; '
        "D('ogbn-arxiv', root='{root}')\"\n"
        "then copy the folder {path!r} here. Or use --dataset synthetic-arxiv (a generated graph "
        "of the same shape)."
    ),
    "cora": (
        "Cora is not under {root!r} (looked for {path!r}). This machine cannot download it. "
        "On a machine with network access run:\n"
        '    python -c "from torch_geometric.datasets import Planetoid; '
        "Planetoid('{root}', 'Cora')\"\n"
        "then copy the folder {path!r} here. Or use --dataset synthetic-cora."
    ),
}


def load_graph(name: str, root: str = "data", platform: str = "pyg", seed: int = 0) -> GraphData:
    """The dataset ``name``: ``ogbn-arxiv``/``cora`` from disk (ogb / PyG / DGL loaders, under
    ``root``; :class:`DatasetNotFound`, saying how to get it, where it is not there), or a
    ``synthetic-*`` shape, generated. :class:`MissingDependency` is the other error the
    command line explains rather than shows as a traceback."""
    if name in SHAPES:
        return synthetic_graph(name, seed=seed, **SHAPES[name])
    if name == "ogbn-arxiv":
        path = os.path.join(root, "ogbn_arxiv")
        if not os.path.isdir(path):
            raise DatasetNotFound(_HOW_TO_GET["ogbn-arxiv"].format(root=root, path=path))
        return _load_arxiv(root, platform)
    if name == "cora":
        path = os.path.join(root, "Cora")
        if not os.path.isdir(path):
            raise DatasetNotFound(_HOW_TO_GET["cora"].format(root=root, path=path))
        return _load_cora(root, platform)
    raise ValueError(
        f"unknown dataset {name!r}; choose ogbn-arxiv, cora or one of {sorted(SHAPES)}"
    )


def _load_arxiv(root: str, platform: str) -> GraphData:  # pragma: no cover - needs the data
    if platform == "dgl":
        from ogb.nodeproppred import DglNodePropPredDataset

        dataset = DglNodePropPredDataset("ogbn-arxiv", root=root)
        graph, labels = dataset[0]
        src, dst = graph.edges()
        edge_index, x = torch.stack([src, dst]), graph.ndata["feat"]
    else:
        from ogb.nodeproppred import PygNodePropPredDataset

        dataset = PygNodePropPredDataset("ogbn-arxiv", root=root)
        data = dataset[0]
        edge_index, x, labels = data.edge_index, data.x, data.y
    split = dataset.get_idx_split()
    from torch_geometric.utils import to_undirected

    return GraphData(
        "ogbn-arxiv",
        x,
        labels.view(-1),
        to_undirected(edge_index, num_nodes=x.size(0)),
        split["train"],
        split["valid"],
        split["test"],
        int(labels.max()) + 1,
    )


def _load_cora(root: str, platform: str) -> GraphData:  # pragma: no cover - needs the data
    from torch_geometric.datasets import Planetoid

    data = Planetoid(root, "Cora")[0]
    idx = torch.arange(data.num_nodes)
    return GraphData(
        "cora",
        data.x,
        data.y,
        data.edge_index,
        idx[data.train_mask],
        idx[data.val_mask],
        idx[data.test_mask],
        int(data.y.max()) + 1,
    )
