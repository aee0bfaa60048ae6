"""The changes of PyG layers timed at the end of an advised run (:mod:`..layers.trials`).

``fused-sparse``: a layer with its own ``message_and_aggregate`` given an ``edge_index``
runs a message per edge, then a scatter; given ``adj_t``, a sparse matrix of the same graph,
it runs one sparse product instead. The candidate is ``torch.sparse`` CSR (no extra
package): the edges, their weights (or ones: a repeated edge counts twice, as its messages
do) summed per pair, transposed as PyG's ``adj_t`` is (row = target); where torch-sparse is
installed, its ``SparseTensor`` too; where the layer fuses an ``EdgeIndex`` sorted by target
(PyG's ``SUPPORTS_FUSED_EDGE_INDEX``: GraphConv from 2.6), that too; the best kept.

``project-first``: SAGEConv, GraphConv and GINConv sum their neighbours' features at the
input's width, then project; a linear sum commutes with the projection, so projecting first
(the bias after the sum) is the same model with the sum at the output's width
(:class:`ProjectFirst`). Where the input is much wider, the edges carry less.
"""

from __future__ import annotations

import copy
import functools
import inspect
import time
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ..layers.trials import Change, register
from .signals import fused

__all__ = [
    "fused_sparse",
    "fused_sparse_tensor",
    "fused_edge_index",
    "to_adj_t",
    "ProjectFirst",
    "project_first",
]

#: How much wider the input must be than the output for ``project-first`` to be timed.
WIDER = 2


@functools.lru_cache(maxsize=None)
def _signature(forward: Any) -> inspect.Signature:
    """``forward``'s signature, read once: :class:`ProjectFirst` binds every call's arguments
    by it, and reading it anew costs more than the rest of the binding."""
    return inspect.signature(forward)


def _bound(layer: Any, args: tuple, kwargs: dict) -> Dict[str, Any]:
    """A call's arguments by the names of the stock layer's ``forward``."""
    stock = getattr(layer, "_ic_stock", type(layer))
    bound = _signature(stock.forward).bind(None, *args, **kwargs).arguments
    return {k: v for k, v in bound.items() if k != "self"}


def to_adj_t(edge_index: torch.Tensor, edge_weight: Optional[torch.Tensor], n: int) -> Any:
    """``edge_index`` (and its weights) as PyG's ``adj_t``, a ``torch.sparse`` CSR matrix of
    ``n`` by ``n``: row = target, column = source, repeated edges summed."""
    values = edge_weight
    if values is None:
        values = torch.ones(edge_index.size(1), device=edge_index.device)
    coo = torch.sparse_coo_tensor(edge_index.flip(0), values, (n, n)).coalesce()
    return coo.to_sparse_csr()


def _edge_index_call(
    layer: Any, facts: Dict[str, Any]
) -> Optional[Tuple[Dict[str, Any], torch.Tensor, Optional[torch.Tensor], int]]:
    """The last call's arguments by name, its ``edge_index``, ``edge_weight`` and nodes, where
    the layer has its own ``message_and_aggregate`` and was given a plain ``edge_index`` (not
    bipartite), else None."""
    stock = getattr(layer, "_ic_stock", type(layer))
    if not fused(stock):
        return None
    bound = _bound(layer, *facts["inputs"])
    x, edge_index = bound.get("x"), bound.get("edge_index")
    if not isinstance(x, torch.Tensor) or type(edge_index) is not torch.Tensor:
        return None  # bipartite features, or already sparse (an EdgeIndex, a SparseTensor)
    if edge_index.layout != torch.strided or edge_index.dim() != 2 or edge_index.size(0) != 2:
        return None
    return bound, edge_index, bound.get("edge_weight"), x.size(-2)


def _given(bound: Dict[str, Any], adj_t: Any) -> Dict[str, Any]:
    """The call's arguments with ``adj_t`` for ``edge_index`` (the weights in it)."""
    changed = dict(bound, edge_index=adj_t)
    if "edge_weight" in changed:
        changed["edge_weight"] = None
    return changed


def fused_sparse(layer: Any, facts: Dict[str, Any]) -> Optional[Change]:
    """The change to ``adj_t`` as a ``torch.sparse`` CSR matrix, or None (see
    :func:`_edge_index_call`)."""
    call = _edge_index_call(layer, facts)
    if call is None:
        return None
    bound, edge_index, weight, n = call
    t0 = time.perf_counter()
    adj_t = to_adj_t(edge_index, weight, n)
    convert_s = time.perf_counter() - t0
    weights = ", its edge weights as the values" if weight is not None else ""
    return Change(
        "fused-sparse",
        "pass adj_t, the graph as a sparse matrix, where the layer takes edge_index: "
        "adj_t = torch.sparse_coo_tensor(edge_index.flip(0), "
        + ("edge_weight" if weight is not None else "torch.ones(num_edges)")
        + f", (N, N)).coalesce().to_sparse_csr(){weights}, made once where the graph stays",
        ((), _given(bound, adj_t)),
        convert_s=convert_s,
        variant="torch.sparse CSR",
    )


def _with_torch_sparse() -> bool:
    """Whether PyG found torch-sparse (its ``SparseTensor`` usable)."""
    from torch_geometric import typing as pyg_typing

    return bool(getattr(pyg_typing, "WITH_TORCH_SPARSE", False))


def fused_sparse_tensor(layer: Any, facts: Dict[str, Any]) -> Optional[Change]:
    """The change to ``adj_t`` as torch-sparse's ``SparseTensor`` (registered where it is
    installed), or None (see :func:`_edge_index_call`)."""
    from torch_geometric import typing as pyg_typing

    call = _edge_index_call(layer, facts)
    if call is None:
        return None
    bound, edge_index, weight, n = call
    t0 = time.perf_counter()
    adj_t = pyg_typing.SparseTensor(
        row=edge_index[1], col=edge_index[0], value=weight, sparse_sizes=(n, n)
    )
    convert_s = time.perf_counter() - t0
    value = "edge_weight" if weight is not None else "None"
    return Change(
        "fused-sparse",
        "pass adj_t, the graph as torch-sparse's SparseTensor, where the layer takes "
        f"edge_index: adj_t = SparseTensor(row=edge_index[1], col=edge_index[0], value={value}, "
        "sparse_sizes=(N, N)), made once where the graph stays",
        ((), _given(bound, adj_t)),
        convert_s=convert_s,
        variant="SparseTensor",
    )


def _edge_index_class() -> Any:
    """PyG's ``EdgeIndex`` (2.5 and later), or None."""
    import torch_geometric

    return getattr(torch_geometric, "EdgeIndex", None)


def fused_edge_index(layer: Any, facts: Dict[str, Any]) -> Optional[Change]:
    """The change to an ``EdgeIndex`` sorted by target, for a layer that fuses one
    (``SUPPORTS_FUSED_EDGE_INDEX``), or None (see :func:`_edge_index_call`). The index caches
    its compressed pointers at first use: made here, and counted in the conversion."""
    stock = getattr(layer, "_ic_stock", type(layer))
    if not getattr(stock, "SUPPORTS_FUSED_EDGE_INDEX", False):
        return None
    call = _edge_index_call(layer, facts)
    if call is None:
        return None
    bound, edge_index, weight, n = call
    t0 = time.perf_counter()
    index, perm = _edge_index_class()(edge_index, sparse_size=(n, n)).sort_by("col")
    index.get_csc()
    changed = dict(bound, edge_index=index)
    if weight is not None:
        changed["edge_weight"] = weight if perm is None else weight[perm]
    convert_s = time.perf_counter() - t0
    weights = " (edge_weight = edge_weight[perm])" if weight is not None else ""
    return Change(
        "fused-sparse",
        "pass edge_index as PyG's EdgeIndex sorted by target, which this layer fuses: "
        "edge_index, perm = EdgeIndex(edge_index, sparse_size=(N, N)).sort_by('col')"
        f"{weights}, made once where the graph stays",
        ((), changed),
        convert_s=convert_s,
        variant="EdgeIndex",
    )


register("pyg", "fused-sparse", fused_sparse)
if _with_torch_sparse():
    register("pyg", "fused-sparse", fused_sparse_tensor)
if _edge_index_class() is not None:
    register("pyg", "fused-sparse", fused_edge_index)


def _first_linear(layer: Any) -> Any:
    """The projection a layer applies after its sum: ``lin_l`` (SAGEConv), ``lin_rel``
    (GraphConv), its ``nn``'s first Linear (GINConv), or None where the sum is not linear."""
    from torch_geometric.nn import GINConv, GraphConv, SAGEConv

    if not isinstance(getattr(layer, "aggr", None), str) or layer.aggr not in LINEAR_SUMS:
        return None
    if isinstance(layer, SAGEConv) and not layer.project:
        return layer.lin_l
    if isinstance(layer, GraphConv):
        return layer.lin_rel
    if isinstance(layer, GINConv):
        nn = layer.nn
        first = nn[0] if isinstance(nn, torch.nn.Sequential) and len(nn) else nn
        return first if isinstance(first, torch.nn.Linear) else None
    return None  # (PyG's Linear, lin_l and lin_rel, has a weight and a bias as torch's does)


#: Aggregations that are linear sums (a projection commutes with them).
LINEAR_SUMS = ("add", "sum", "mean")


class ProjectFirst(torch.nn.Module):
    """A SAGEConv, GraphConv or GINConv (``conv``, its parameters this module's) computed with
    its projection before the sum: ``h = x @ W.T``, the sum of ``h`` over the edges, then the
    bias and the rest as the layer has them. The same outputs up to rounding."""

    def __init__(self, conv: Any) -> None:
        """Compute ``conv`` (a plain feature matrix ``x``: not a bipartite pair)."""
        super().__init__()
        self.conv = conv

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The layer's forward, projected first."""
        from torch_geometric.nn import GINConv, GraphConv

        bound = _bound(self.conv, args, kwargs)
        c, x, edge_index = self.conv, bound["x"], bound["edge_index"]
        lin = _first_linear(c)
        h = F.linear(x, lin.weight)
        more = {"edge_weight": bound.get("edge_weight")} if isinstance(c, GraphConv) else {}
        out = c.propagate(edge_index, x=(h, h), size=bound.get("size"), **more)
        if isinstance(c, GINConv):
            out = out + (1 + c.eps) * h
        if lin.bias is not None:
            out = out + lin.bias
        if isinstance(c, GINConv):
            return c.nn[1:](out) if isinstance(c.nn, torch.nn.Sequential) else out
        if isinstance(c, GraphConv):
            return out + c.lin_root(x)
        if c.root_weight:
            out = out + c.lin_r(x)
        return F.normalize(out, p=2.0, dim=-1) if c.normalize else out


def _widths(lin: Any) -> Tuple[int, int]:
    """A projection's input and output widths (torch's Linear or PyG's, its weight made)."""
    out, wide = lin.weight.shape
    return wide, out


def project_first(layer: Any, facts: Dict[str, Any]) -> Optional[Change]:
    """The change to projecting before the sum, for a SAGEConv, GraphConv or GINConv whose
    sum is linear and whose input is at least :data:`WIDER` times its output, or None."""
    lin = _first_linear(layer)
    if lin is None:
        return None
    wide, narrow = _widths(lin)
    x = _bound(layer, *facts["inputs"]).get("x")
    if not isinstance(x, torch.Tensor) or wide < WIDER * narrow:
        return None
    name = type(layer).__name__
    return Change(
        "project-first",
        f"project before the sum: a {name} whose forward computes h = x @ W.T first (W: its "
        f"first projection's weight), sums h over the edges ({narrow} wide, not {wide}), then "
        "adds the bias and the rest; the same parameters and outputs (docs/advice.md has the "
        "subclass)",
        facts["inputs"],
        layer=ProjectFirst(copy.deepcopy(layer)),
    )


register("pyg", "project-first", project_first)
