"""The study's model: a 3-layer GCN with the instrumented (or the stock) PyG or DGL layers.

in -> hidden -> hidden -> classes, ReLU between the layers, log_softmax at the end: the model
of the published profiling of PyG and DGL this package grew out of. ``model="sage"`` builds
the same network with GraphSAGE layers (``SAGEConv``, mean aggregation). :func:`build_model`
also prepares the graph argument the framework's layer takes.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from instrumented_convs import name_layers

from .compare import MODELS
from .data import GraphData, MissingDependency

__all__ = ["PygGCN", "DglGCN", "build_model", "require_torch_sparse", "MODELS"]

#: The study's models (``--model``) and how the reports name them.


def require_torch_sparse() -> Any:
    """The ``torch_sparse`` module, or :class:`MissingDependency` saying how to get it."""
    try:
        import torch_sparse
    except ImportError as exc:
        raise MissingDependency(
            "SparseTensor input (--sparse / --with-sparse) needs torch-sparse, which is not "
            "installed "
            f"here ({exc}). Install it (pip install instrumented_convs[sparse], or torch-sparse "
            f"from "
            "https://data.pyg.org/whl/ for your torch version), or run without --sparse / "
            "--with-sparse: "
            "PyG's edge_index path and DGL need only pure-Python packages."
        ) from exc
    return torch_sparse


class PygGCN(torch.nn.Module):
    """The study's 3-layer network with PyG layers (instrumented ``GCNConv`` unless ``conv_cls``).

    ``conv_cls(in, out)`` builds a layer taking ``(x, edge_index or adj_t)``: the stock
    ``GCNConv``, or ``SAGEConv`` for the GraphSAGE model (:func:`build_model`).
    """

    def __init__(self, in_channels: int, hidden: int, classes: int, conv_cls: Any = None) -> None:
        """Three layers: in -> hidden -> hidden -> classes."""
        super().__init__()
        if conv_cls is None:
            from instrumented_convs.pyg import GCNConv as conv_cls
        self.convs = torch.nn.ModuleList(
            [conv_cls(in_channels, hidden), conv_cls(hidden, hidden), conv_cls(hidden, classes)]
        )

    def forward(self, x: Tensor, adj: Any) -> Tensor:
        """in -> hidden -> hidden -> classes, ReLU between, log_softmax at the end."""
        for conv in self.convs[:-1]:
            x = F.relu(conv(x, adj))
        return F.log_softmax(self.convs[-1](x, adj), dim=-1)


class DglGCN(torch.nn.Module):
    """The study's 3-layer network with DGL layers (instrumented ``GraphConv`` unless ``conv_cls``).

    ``conv_cls(in, out)`` builds a layer taking ``(graph, feat)``: the stock ``GraphConv``, or
    ``functools.partial(SAGEConv, aggregator_type="mean")`` for GraphSAGE (:func:`build_model`).
    """

    def __init__(self, in_channels: int, hidden: int, classes: int, conv_cls: Any = None) -> None:
        """Three layers: in -> hidden -> hidden -> classes."""
        super().__init__()
        if conv_cls is None:
            from instrumented_convs.dgl import GraphConv as conv_cls
        self.convs = torch.nn.ModuleList(
            [conv_cls(in_channels, hidden), conv_cls(hidden, hidden), conv_cls(hidden, classes)]
        )

    def forward(self, x: Tensor, graph: Any) -> Tensor:
        """Same shape as :class:`PygGCN`; DGL layers take the graph first.

        ``graph`` is one ``DGLGraph`` (full graph: every layer on it), or a list of blocks,
        one per layer (a sampled mini-batch: layer ``i`` runs ``conv(blocks[i], x)``, and
        the output has a row per destination node of the last block).
        """
        if isinstance(graph, (list, tuple)):
            if len(graph) != len(self.convs):
                raise ValueError(
                    f"{len(self.convs)} layers need {len(self.convs)} blocks, got {len(graph)}"
                )
            graphs = list(graph)
        else:
            graphs = [graph] * len(self.convs)
        for conv, g in zip(self.convs[:-1], graphs):
            x = F.relu(conv(g, x))
        return F.log_softmax(self.convs[-1](graphs[-1], x), dim=-1)


def _conv_cls(platform: str, model: str, stock: bool) -> Any:
    """The layer class (``conv_cls(in, out)``) of ``model`` for ``platform``."""
    if model == "gcn":
        if platform == "pyg":
            if stock:
                from torch_geometric.nn import GCNConv
            else:
                from instrumented_convs.pyg import GCNConv
            return GCNConv
        if stock:
            from dgl.nn import GraphConv
        else:
            from instrumented_convs.dgl import GraphConv
        return GraphConv
    if platform == "pyg":  # SAGEConv's default aggregation is the mean
        if stock:
            from torch_geometric.nn import SAGEConv
        else:
            from instrumented_convs.pyg import SAGEConv
        return SAGEConv
    if stock:
        from dgl.nn import SAGEConv as DglSAGEConv
    else:
        from instrumented_convs.dgl import SAGEConv as DglSAGEConv
    return functools.partial(DglSAGEConv, aggregator_type="mean")


def build_model(
    platform: str,
    data: GraphData,
    hidden: int = 128,
    sparse: bool = False,
    stock: bool = False,
    model: str = "gcn",
) -> Tuple[torch.nn.Module, Any]:
    """The model for ``platform`` (``pyg``/``dgl``) and the graph argument it takes.

    ``model`` is ``"gcn"`` (``GCNConv`` / ``GraphConv``) or ``"sage"`` (the same 3-layer
    network with ``SAGEConv``, mean aggregation: PyG ``SAGEConv(in, out)``, DGL
    ``SAGEConv(in, out, "mean")``). ``stock=True`` builds the same model with the upstream
    layers (same parameter names, so ``state_dict`` moves between the two), for side-by-side
    measurements.

    PyG takes ``edge_index``, or with ``sparse`` a ``torch_sparse.SparseTensor`` ``adj_t``
    (the study's ``T.ToSparseTensor()`` setup; raises :class:`MissingDependency` without
    torch-sparse). DGL takes a ``DGLGraph`` with self-loops added (GraphConv refuses nodes
    without in-edges), for either model.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, not {model!r}")
    in_channels = data.x.size(1)
    if platform == "pyg":
        net: torch.nn.Module = PygGCN(
            in_channels, hidden, data.num_classes, _conv_cls(platform, model, stock)
        )
        graph: Any = data.edge_index
        if sparse:
            SparseTensor = require_torch_sparse().SparseTensor
            ei = data.edge_index
            graph = SparseTensor(
                row=ei[1], col=ei[0], sparse_sizes=(data.num_nodes, data.num_nodes)
            )
    elif platform == "dgl":
        if sparse:
            raise ValueError("--sparse is a PyG option (SparseTensor input)")
        os.environ.setdefault("DGLBACKEND", "pytorch")
        import dgl

        net = DglGCN(in_channels, hidden, data.num_classes, _conv_cls(platform, model, stock))
        ei = data.edge_index
        graph = dgl.add_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=data.num_nodes))
    else:
        raise ValueError(f"platform must be 'pyg' or 'dgl', not {platform!r}")
    name_layers(net)
    return net.to(data.x.device), graph
