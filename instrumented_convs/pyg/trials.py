"""The changes of PyG layers timed at the end of an advised run (:mod:`..layers.trials`).

``fused-sparse``: a layer with its own ``message_and_aggregate`` given an ``edge_index``
runs a message per edge, then a scatter; given ``adj_t``, a sparse matrix of the same graph,
it runs one sparse product instead. The candidate is ``torch.sparse`` CSR (no extra
package): the edges, their weights (or ones: a repeated edge counts twice, as its messages
do) summed per pair, transposed as PyG's ``adj_t`` is (row = target).
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Dict, Optional

import torch

from ..layers.trials import Change, register
from .signals import fused

__all__ = ["fused_sparse", "to_adj_t"]


def to_adj_t(edge_index: torch.Tensor, edge_weight: Optional[torch.Tensor], n: int) -> Any:
    """``edge_index`` (and its weights) as PyG's ``adj_t``, a ``torch.sparse`` CSR matrix of
    ``n`` by ``n``: row = target, column = source, repeated edges summed."""
    values = edge_weight
    if values is None:
        values = torch.ones(edge_index.size(1), device=edge_index.device)
    coo = torch.sparse_coo_tensor(edge_index.flip(0), values, (n, n)).coalesce()
    return coo.to_sparse_csr()


def fused_sparse(layer: Any, facts: Dict[str, Any]) -> Optional[Change]:
    """The change to ``adj_t`` for a layer with its own ``message_and_aggregate`` whose last
    call was given a plain ``edge_index`` (not bipartite), or None."""
    stock = getattr(layer, "_ic_stock", type(layer))
    if not fused(stock):
        return None
    params = list(inspect.signature(stock.forward).parameters)[1:]
    args, kwargs = facts["inputs"]
    bound = dict(zip(params, args), **kwargs)
    x, edge_index = bound.get("x"), bound.get("edge_index")
    if not isinstance(x, torch.Tensor) or type(edge_index) is not torch.Tensor:
        return None  # bipartite features, or already sparse (an EdgeIndex, a SparseTensor)
    if edge_index.layout != torch.strided or edge_index.dim() != 2 or edge_index.size(0) != 2:
        return None
    weight = bound.get("edge_weight")
    t0 = time.perf_counter()
    adj_t = to_adj_t(edge_index, weight, x.size(-2))
    convert_s = time.perf_counter() - t0
    changed = dict(bound, edge_index=adj_t)
    if "edge_weight" in changed:
        changed["edge_weight"] = None
    weights = ", its edge weights as the values" if weight is not None else ""
    return Change(
        "fused-sparse",
        "pass adj_t, the graph as a sparse matrix, where the layer takes edge_index: "
        "adj_t = torch.sparse_coo_tensor(edge_index.flip(0), "
        + ("edge_weight" if weight is not None else "torch.ones(num_edges)")
        + f", (N, N)).coalesce().to_sparse_csr(){weights}, made once where the graph stays",
        ((), changed),
        convert_s=convert_s,
    )


register("pyg", fused_sparse)
