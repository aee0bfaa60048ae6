"""The layers ``check`` compares with the stock ones, and their inputs: the detailed layers
over their input kinds (PyG ``GCNConv``: ``edge_index``, edge weights, ``SparseTensor``,
``torch.sparse``; DGL ``GraphConv`` over its norms and options, ``EdgeWeightNorm``), a
sample of generic layers of both frameworks and their heterogeneous layers (``HeteroConv``,
``HeteroGraphConv``, a conv per relation). Graphs are generated from fixed seeds, so two
calls of a case's ``inputs`` give equal tensors. The frameworks import when a case is made.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

__all__ = ["Case", "cases"]

F_IN, F_OUT = 16, 8


@dataclass(frozen=True)
class Case:
    """One layer, one way to call it."""

    framework: str  #: ``pyg`` or ``dgl``
    cls: str  #: the class name in ``torch_geometric.nn`` / ``dgl.nn`` and ours
    kind: str  #: the option or input kind (``edge_index``, ``SparseTensor``, ``norm=left``)
    kwargs: Tuple[Tuple[str, Any], ...]  #: the constructor's keyword arguments
    inputs: Callable[[int, torch.device], Tuple[tuple, Dict[str, Any]]]  #: (nodes, device)
    needs: Optional[str] = None  #: a module it needs (``torch_sparse``)
    args: Tuple[Any, ...] = (F_IN, F_OUT)  #: the constructor's positional arguments
    #: makes a child module given as the first argument (GIN's MLP; a heterogeneous layer's
    #: module per relation), fresh for each layer
    child: Optional[Callable[[], Any]] = None

    @property
    def name(self) -> str:
        """``PyG GCNConv, edge_index``."""
        return f"{'PyG' if self.framework == 'pyg' else 'DGL'} {self.cls}, {self.kind}"

    def make(self, stock: bool) -> torch.nn.Module:
        """A stock layer, or ours, built from the same seed (the same parameters)."""
        if self.framework == "pyg":
            mod = "torch_geometric.nn" if stock else "instrumented_convs.pyg"
        else:
            os.environ.setdefault("DGLBACKEND", "pytorch")
            mod = "dgl.nn" if stock else "instrumented_convs.dgl"
        cls = getattr(importlib.import_module(mod), self.cls)
        torch.manual_seed(1234)
        args = ((self.child(),) if self.child is not None else ()) + tuple(self.args)
        return cls(*args, **dict(self.kwargs))


def _edges(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    e = 4 * n
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    loops = torch.arange(n)
    return torch.stack([torch.cat([src, loops]), torch.cat([dst, loops])])


def _x(n: int, f: int = F_IN, seed: int = 7) -> torch.Tensor:
    return torch.randn(n, f, generator=torch.Generator().manual_seed(seed))


def _w(e: int) -> torch.Tensor:
    return torch.rand(e, generator=torch.Generator().manual_seed(3)) + 0.5


def _pyg(kind: str) -> Callable[[int, torch.device], Tuple[tuple, Dict[str, Any]]]:
    def inputs(n: int, device: torch.device) -> Tuple[tuple, Dict[str, Any]]:
        ei, x = _edges(n, 11), _x(n)
        w = _w(ei.size(1))
        if kind == "edge_weight":
            return (x.to(device), ei.to(device), w.to(device)), {}
        if kind == "SparseTensor":
            from torch_sparse import SparseTensor

            adj = SparseTensor(row=ei[1], col=ei[0], value=w, sparse_sizes=(n, n))
            return (x.to(device), adj.to(device)), {}
        if kind == "torch.sparse CSR":
            from torch_geometric.utils import to_torch_csr_tensor

            adj = to_torch_csr_tensor(ei.flip(0), w, size=(n, n))
            return (x.to(device), adj.to(device)), {}
        return (x.to(device), ei.to(device)), {}

    return inputs


def _dgl(kind: str) -> Callable[[int, torch.device], Tuple[tuple, Dict[str, Any]]]:
    def inputs(n: int, device: torch.device) -> Tuple[tuple, Dict[str, Any]]:
        os.environ.setdefault("DGLBACKEND", "pytorch")
        import dgl

        ei = _edges(n, 13)
        g = dgl.graph((ei[0], ei[1]), num_nodes=n).to(device)
        x, w = _x(n).to(device), _w(ei.size(1)).to(device)
        if kind == "edge_weight":
            return (g, x), {"edge_weight": w}
        if kind == "weights":  # EdgeWeightNorm's input: the graph and its edge weights
            return (g, w), {}
        if kind == "external weight":
            return (g, x), {"weight": _x(F_IN, F_OUT, seed=8).to(device)}
        if kind == "bipartite":
            half = n // 2
            b = dgl.heterograph({("s", "e", "d"): (ei[0], ei[1] % half)}, {"s": n, "d": half}).to(
                device
            )
            return (b, (x, _x(half, seed=9).to(device))), {}
        return (g, x), {}

    return inputs


#: The relations of the heterogeneous cases: a node type's own, and both ways between two.
_RELATIONS = (("a", "to", "b"), ("b", "rev", "a"), ("a", "near", "a"))


def _hetero(framework: str) -> Callable[[int, torch.device], Tuple[tuple, Dict[str, Any]]]:
    """A heterogeneous graph's inputs: PyG's dicts of features and edge indices, or DGL's
    heterograph and features (node type ``b`` has half as many nodes as ``a``)."""

    def inputs(n: int, device: torch.device) -> Tuple[tuple, Dict[str, Any]]:
        half = n // 2
        sizes = {"a": n, "b": half}
        x = {t: _x(k, seed=7 + i).to(device) for i, (t, k) in enumerate(sizes.items())}
        edges = {}
        for i, rel in enumerate(_RELATIONS):
            ei = _edges(n, 17 + i)
            edges[rel] = torch.stack([ei[0] % sizes[rel[0]], ei[1] % sizes[rel[2]]])
        if framework == "pyg":
            return (x, {k: v.to(device) for k, v in edges.items()}), {}
        os.environ.setdefault("DGLBACKEND", "pytorch")
        import dgl

        graph = dgl.heterograph({k: (v[0], v[1]) for k, v in edges.items()}, sizes)
        return (graph.to(device), x), {}

    return inputs


def _per_relation(framework: str) -> Dict[Any, torch.nn.Module]:
    """A conv per relation (the stock classes: the heterogeneous layer is what is compared)."""
    if framework == "pyg":
        import torch_geometric.nn as nn

        convs = [nn.SAGEConv(F_IN, F_OUT), nn.GATConv(F_IN, F_OUT, add_self_loops=False)]
        convs.append(nn.GraphConv(F_IN, F_OUT))
        return dict(zip(_RELATIONS, convs))
    import dgl.nn as nn

    convs = [nn.SAGEConv(F_IN, F_OUT, "mean"), nn.GraphConv(F_IN, F_OUT), nn.GINConv(_mlp())]
    return dict(zip(_RELATIONS, convs))


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(F_IN, F_OUT), torch.nn.ReLU())


def cases(quick: bool = False) -> List[Case]:
    """The detailed layers over their input kinds, then a sample of generic layers."""
    pyg: List[Case] = [
        Case("pyg", "GCNConv", "edge_index", (), _pyg("edge_index")),
        Case("pyg", "GCNConv", "edge_weight", (), _pyg("edge_weight")),
        Case("pyg", "GCNConv", "SparseTensor", (), _pyg("SparseTensor"), "torch_sparse"),
        Case("pyg", "GCNConv", "torch.sparse CSR", (), _pyg("torch.sparse CSR")),
        Case(
            "pyg",
            "GCNConv",
            "improved, cached",
            (("improved", True), ("cached", True)),
            _pyg("edge_index"),
        ),
        Case("pyg", "GCNConv", "normalize=False", (("normalize", False),), _pyg("edge_weight")),
        Case("pyg", "SAGEConv", "edge_index", (), _pyg("edge_index")),
        Case("pyg", "GATConv", "heads=2", (("heads", 2),), _pyg("edge_index")),
        Case("pyg", "GINConv", "edge_index", (), _pyg("edge_index"), args=(), child=_mlp),
        Case("pyg", "TransformerConv", "edge_index", (), _pyg("edge_index")),
        Case(
            "pyg",
            "HeteroConv",
            "3 relations",
            (("aggr", "sum"),),
            _hetero("pyg"),
            args=(),
            child=lambda: _per_relation("pyg"),
        ),
    ]
    dgl: List[Case] = [
        Case("dgl", "GraphConv", f"norm={norm}", (("norm", norm),), _dgl("plain"))
        for norm in ("both", "left", "right", "none")
    ] + [
        Case("dgl", "GraphConv", "edge_weight", (("norm", "both"),), _dgl("edge_weight")),
        Case("dgl", "GraphConv", "external weight", (("weight", False),), _dgl("external weight")),
        Case("dgl", "GraphConv", "bipartite", (), _dgl("bipartite")),
        Case("dgl", "EdgeWeightNorm", "norm=both", (("norm", "both"),), _dgl("weights"), args=()),
        Case("dgl", "EdgeWeightNorm", "norm=right", (("norm", "right"),), _dgl("weights"), args=()),
        Case("dgl", "SAGEConv", "mean", (("aggregator_type", "mean"),), _dgl("plain")),
        Case("dgl", "GATConv", "heads=2", (("num_heads", 2),), _dgl("plain")),
        Case(
            "dgl",
            "GINConv",
            "sum",
            (("aggregator_type", "sum"),),
            _dgl("plain"),
            args=(),
            child=_mlp,
        ),
        Case(
            "dgl",
            "HeteroGraphConv",
            "3 relations",
            (("aggregate", "sum"),),
            _hetero("dgl"),
            args=(),
            child=lambda: _per_relation("dgl"),
        ),
    ]
    if quick:  # the detailed layers' kinds and one generic layer each
        pyg = [c for c in pyg if c.cls == "GCNConv" or c.cls == "SAGEConv"]
        dgl = [c for c in dgl if c.cls in ("GraphConv", "EdgeWeightNorm", "GATConv")]
    return pyg + dgl
