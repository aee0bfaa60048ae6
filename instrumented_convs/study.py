"""The profiling study of the seeds, as reusable pieces: data, models and the timed loop.

- :func:`synthetic_graph` generates a graph of a given shape whose labels are learnable from
  the features and the neighbourhood (deterministic given the seed); :data:`SHAPES` holds
  ogbn-arxiv's and Cora's shapes.
- :func:`load_graph` returns the real dataset (ogb / PyG / DGL loaders) when it is on disk
  under ``root``, and explains how to get it when it is not; ``synthetic-*`` names generate.
- :func:`build_model` makes the seeds' 3-layer GCN (in -> hidden -> hidden -> classes, ReLU,
  log_softmax) with the instrumented PyG or DGL layer, and :func:`train` runs the seeds'
  loop (Adam, NLL loss) with ``region()`` around each phase of every epoch.

Used by ``examples/arxiv.py``, ``examples/cora.py`` and ``python -m instrumented_convs``.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ._step import region

logger = logging.getLogger(__name__)

#: Shapes of the seeds' datasets. ``num_edges`` counts directed edges before symmetrising
#: for arxiv (as ogbn-arxiv stores them), and after for Cora (as Planetoid stores them).
SHAPES: Dict[str, Dict[str, Any]] = {
    "synthetic-arxiv": dict(num_nodes=169_343, num_edges=1_166_243, symmetric_count=False,
                            num_features=128, num_classes=40, split=(90_941, 29_799, 48_603)),
    "synthetic-cora": dict(num_nodes=2_708, num_edges=10_556, symmetric_count=True,
                           num_features=1_433, num_classes=7, split=(140, 500, 1_000)),
    "synthetic-quick": dict(num_nodes=1_000, num_edges=6_000, symmetric_count=False,
                            num_features=16, num_classes=5, split=(500, 200, 300)),
}


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
        return GraphData(self.name, self.x.to(device), self.y.to(device), self.edge_index.to(device),
                         self.train_idx.to(device), self.valid_idx.to(device), self.test_idx.to(device),
                         self.num_classes)

    def describe(self) -> str:
        """One line: name, nodes, edges, features, classes, split sizes."""
        return (f"{self.name}: {self.num_nodes:,} nodes, {self.num_edges:,} directed edges, "
                f"{self.x.size(1)} features, {self.num_classes} classes, split "
                f"{len(self.train_idx):,}/{len(self.valid_idx):,}/{len(self.test_idx):,}")


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
    x = (signal / num_features ** 0.5) * centroids[y] + torch.randn(n, num_features, generator=g)

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
        within = order[starts[cls] + (torch.rand(m, generator=g) * counts[cls]).long().clamp_max(counts[cls] - 1)]
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
    return GraphData(name, x, y, edge_index, perm[:a], perm[a:a + b], perm[a + b:a + b + c], num_classes)


class DatasetNotFound(FileNotFoundError):
    """The real dataset is not on disk (no network here to download it)."""


_HOW_TO_GET = {
    "ogbn-arxiv": (
        "ogbn-arxiv is not under {root!r} (looked for {path!r}). This machine cannot download "
        "it. On a machine with network access run:\n"
        "    pip install ogb\n"
        "    python -c \"from ogb.nodeproppred import PygNodePropPredDataset as D; D('ogbn-arxiv', root='{root}')\"\n"
        "then copy the folder {path!r} here. Or use --dataset synthetic-arxiv (a generated graph "
        "of the same shape)."
    ),
    "cora": (
        "Cora is not under {root!r} (looked for {path!r}). This machine cannot download it. "
        "On a machine with network access run:\n"
        "    python -c \"from torch_geometric.datasets import Planetoid; Planetoid('{root}', 'Cora')\"\n"
        "then copy the folder {path!r} here. Or use --dataset synthetic-cora."
    ),
}


def load_graph(name: str, root: str = "data", platform: str = "pyg", seed: int = 0) -> GraphData:
    """The dataset ``name``: ``ogbn-arxiv``/``cora`` from disk, or a ``synthetic-*`` shape."""
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
    raise ValueError(f"unknown dataset {name!r}; choose ogbn-arxiv, cora or one of {sorted(SHAPES)}")


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

    return GraphData("ogbn-arxiv", x, labels.view(-1), to_undirected(edge_index, num_nodes=x.size(0)),
                     split["train"], split["valid"], split["test"], int(labels.max()) + 1)


def _load_cora(root: str, platform: str) -> GraphData:  # pragma: no cover - needs the data
    from torch_geometric.datasets import Planetoid

    data = Planetoid(root, "Cora")[0]
    idx = torch.arange(data.num_nodes)
    return GraphData("cora", data.x, data.y, data.edge_index, idx[data.train_mask], idx[data.val_mask],
                     idx[data.test_mask], int(data.y.max()) + 1)


class PygGCN(torch.nn.Module):
    """The seeds' 3-layer GCN with PyG layers (instrumented ``GCNConv`` unless ``conv_cls``)."""

    def __init__(self, in_channels: int, hidden: int, classes: int, conv_cls: Any = None) -> None:
        """Three layers: in -> hidden -> hidden -> classes."""
        super().__init__()
        if conv_cls is None:
            from .pyg import GCNConv as conv_cls
        self.convs = torch.nn.ModuleList([conv_cls(in_channels, hidden), conv_cls(hidden, hidden),
                                          conv_cls(hidden, classes)])

    def forward(self, x: Tensor, adj: Any) -> Tensor:
        """in -> hidden -> hidden -> classes, ReLU between, log_softmax at the end."""
        for conv in self.convs[:-1]:
            x = F.relu(conv(x, adj))
        return F.log_softmax(self.convs[-1](x, adj), dim=-1)


class DglGCN(torch.nn.Module):
    """The seeds' 3-layer GCN with DGL layers (instrumented ``GraphConv`` unless ``conv_cls``)."""

    def __init__(self, in_channels: int, hidden: int, classes: int, conv_cls: Any = None) -> None:
        """Three layers: in -> hidden -> hidden -> classes."""
        super().__init__()
        if conv_cls is None:
            from .dgl import GraphConv as conv_cls
        self.convs = torch.nn.ModuleList([conv_cls(in_channels, hidden), conv_cls(hidden, hidden),
                                          conv_cls(hidden, classes)])

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        """Same shape as :class:`PygGCN`; DGL layers take the graph first."""
        for conv in self.convs[:-1]:
            x = F.relu(conv(graph, x))
        return F.log_softmax(self.convs[-1](graph, x), dim=-1)


def build_model(platform: str, data: GraphData, hidden: int = 128, sparse: bool = False,
                stock: bool = False) -> Tuple[torch.nn.Module, Any]:
    """The model for ``platform`` (``pyg``/``dgl``) and the graph argument it takes.

    ``stock=True`` builds the same model with the upstream layers (same parameter names, so
    ``state_dict`` moves between the two), for side-by-side measurements.

    PyG takes ``edge_index``, or with ``sparse`` a ``torch_sparse.SparseTensor`` ``adj_t``
    (the seeds' ``T.ToSparseTensor()`` setup). DGL takes a ``DGLGraph`` with self-loops
    added (GraphConv refuses nodes without in-edges).
    """
    from ._layers import name_layers

    in_channels = data.x.size(1)
    if platform == "pyg":
        conv_cls = None
        if stock:
            from torch_geometric.nn import GCNConv as conv_cls
        model: torch.nn.Module = PygGCN(in_channels, hidden, data.num_classes, conv_cls)
        graph: Any = data.edge_index
        if sparse:
            from torch_sparse import SparseTensor

            ei = data.edge_index
            graph = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(data.num_nodes, data.num_nodes))
    elif platform == "dgl":
        os.environ.setdefault("DGLBACKEND", "pytorch")
        import dgl

        if sparse:
            raise ValueError("--sparse is a PyG option (SparseTensor input)")
        conv_cls = None
        if stock:
            from dgl.nn import GraphConv as conv_cls
        model = DglGCN(in_channels, hidden, data.num_classes, conv_cls)
        ei = data.edge_index
        graph = dgl.add_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=data.num_nodes))
    else:
        raise ValueError(f"platform must be 'pyg' or 'dgl', not {platform!r}")
    name_layers(model)
    return model.to(data.x.device), graph


@dataclass
class TrainResult:
    """What :func:`train` measured: accuracies and the epochs timed."""

    train_acc: float
    valid_acc: float
    test_acc: float
    epochs: int
    final_loss: float


def accuracy(model: torch.nn.Module, data: GraphData, graph: Any) -> Tuple[float, float, float]:
    """Train/valid/test accuracy, computed with instrumentation off."""
    from . import disabled

    with disabled():
        model.eval()
        with torch.no_grad():
            pred = model(data.x, graph).argmax(dim=-1)
        model.train()
    return tuple(  # type: ignore[return-value]
        float((pred[idx] == data.y[idx]).float().mean()) for idx in (data.train_idx, data.valid_idx, data.test_idx)
    )


def train(
    model: torch.nn.Module,
    data: GraphData,
    graph: Any,
    epochs: int = 100,
    lr: float = 0.01,
    warmup: int = 1,
    on_epoch: Optional[Callable[[int, float], None]] = None,
) -> TrainResult:
    """The seeds' loop: ``warmup`` untimed epochs, then ``epochs`` epochs in regions.

    Each timed epoch is ``region("epoch")`` with ``forward``, ``loss``, ``backward`` and
    ``optimizer.step`` inside (the seeds' epoch-level table), and the layers' steps under
    ``forward``. Warm-up epochs run with instrumentation off, so the first, slower calls
    (allocations, lazy initialisation) do not skew the table.
    """
    from . import disabled

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    loss = torch.zeros(())

    def one_epoch() -> Tensor:
        opt.zero_grad()
        with region("forward"):
            out = model(data.x, graph)
        with region("loss"):
            loss = F.nll_loss(out[data.train_idx], data.y[data.train_idx])
        with region("backward"):
            loss.backward()
        with region("optimizer.step"):
            opt.step()
        return loss

    with disabled():
        for _ in range(warmup):
            one_epoch()
    for epoch in range(epochs):
        with region("epoch", device=data.x.device):
            loss = one_epoch()
        if on_epoch is not None:
            on_epoch(epoch, float(loss.detach()))
    train_acc, valid_acc, test_acc = accuracy(model, data, graph)
    return TrainResult(train_acc, valid_acc, test_acc, epochs, float(loss.detach()))


# -- command line (shared by examples/arxiv.py, examples/cora.py and the compare command) ---

def add_study_arguments(parser: Any, datasets: Tuple[str, ...], default_dataset: str, epochs: int) -> None:
    """Add the study's flags to an ``argparse`` parser."""
    parser.add_argument("--platform", choices=("pyg", "dgl"), default="pyg",
                        help="framework of the instrumented layers: PyTorch Geometric GCNConv or DGL GraphConv")
    parser.add_argument("--dataset", choices=datasets, default=default_dataset,
                        help="the real dataset (needs its files under --root; no download here) or a "
                             "generated graph of the same shape (the default)")
    parser.add_argument("--root", default="data", help="folder holding the real datasets' files")
    parser.add_argument("--hidden-channels", type=int, default=128, help="hidden layer width")
    parser.add_argument("--epochs", type=int, default=epochs, help="timed training epochs")
    parser.add_argument("--warmup", type=int, default=1, help="untimed epochs before the timed ones")
    parser.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    parser.add_argument("--sparse", action="store_true",
                        help="PyG only: feed a torch_sparse.SparseTensor adj_t instead of edge_index "
                             "(the seeds' T.ToSparseTensor() setup; fused message_and_aggregate)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated graph and of the model")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny generated graph (1,000 nodes) and 3 epochs: a smoke run")
    parser.add_argument("--json", metavar="FILE", help="also write the summary and accuracies as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


@dataclass
class StudyRun:
    """One run of the study: its data, result and summary."""

    platform: str
    data: GraphData
    result: TrainResult
    summary: Any
    sparse: bool


def run_study(args: Any) -> StudyRun:
    """Load the data, build the model, train it with progress, return what was measured."""
    from . import registry

    dataset, epochs = args.dataset, args.epochs
    if args.quick:
        dataset, epochs = "synthetic-quick", min(epochs, 3)
    data = load_graph(dataset, root=args.root, platform=args.platform, seed=args.seed).to(args.device)
    torch.manual_seed(args.seed)
    model, graph = build_model(args.platform, data, hidden=args.hidden_channels, sparse=args.sparse)
    if args.platform == "dgl":
        graph = graph.to(args.device)
    progress = None
    if not args.no_progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=epochs, desc=f"{args.platform} {dataset}", unit="epoch", leave=False)

    def on_epoch(epoch: int, loss: float) -> None:
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{loss:.4f}")

    registry.reset()
    try:
        result = train(model, data, graph, epochs=epochs, lr=args.lr, warmup=args.warmup, on_epoch=on_epoch)
    finally:
        if progress is not None:
            progress.close()
    return StudyRun(args.platform, data, result, registry.summary(), args.sparse)


def report(run: StudyRun) -> str:
    """The text a study prints: data, accuracy, the epoch-level and the per-step tables."""
    r, s = run.result, run.summary
    epoch = s["epoch"] if "epoch" in s else None
    lines = [
        run.data.describe(),
        f"{run.platform}{' (SparseTensor)' if run.sparse else ''}: {r.epochs} timed epochs, final loss {r.final_loss:.4f}",
        f"Accuracy: train {r.train_acc:.4f}  valid {r.valid_acc:.4f}  test {r.test_acc:.4f}  "
        f"(chance {1 / run.data.num_classes:.4f})",
    ]
    if epoch is not None:
        lines.append(f"Epoch time: {epoch.mean * 1e3:.2f} ms (mean of {epoch.count} epochs, std {epoch.std * 1e3:.2f} ms)")
    lines += ["", s.select("epoch", max_depth=1).table(title="Epoch phases"), "",
              s.select("epoch/forward").table(title="Steps inside forward")]
    return "\n".join(lines)


def write_json(run: StudyRun, path: str) -> None:
    """Write the run's accuracies and summary to ``path``."""
    import json

    payload = {"platform": run.platform, "sparse": run.sparse, "dataset": run.data.name,
               "accuracy": {"train": run.result.train_acc, "valid": run.result.valid_acc, "test": run.result.test_acc},
               "epochs": run.result.epochs, "summary": run.summary.to_dict()}
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=2)


def study_main(description: str, datasets: Tuple[str, ...], default_dataset: str,
               argv: Optional[list] = None, epochs: int = 100) -> int:
    """The whole command line of a study example: parse, run, print, optionally write JSON."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study_arguments(parser, datasets, default_dataset, epochs=epochs)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        run = run_study(args)
    except DatasetNotFound as exc:
        print(exc, file=sys.stderr)
        return 2
    print(report(run))
    if args.json:
        write_json(run, args.json)
    return 0
