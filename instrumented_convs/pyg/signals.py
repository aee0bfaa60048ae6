"""The advice's signals of PyG layers (``configure(advise=True)``): each call's graph noted
(:mod:`..core.meters.signals`), and at the end what the layer's options and last graph say:
the options the rules read, and where the layer adds self-loops, how many nodes had one
already. The options are read of the layers whose cache keeps the normalised graph alone
(:data:`NOTED`: ``SGConv``'s and ``SSGConv``'s keep the propagated features too, another
condition), and those with a fused ``message_and_aggregate`` (:func:`fused`); every layer's
last call's inputs are held for the changes timed at the end (:mod:`.trials`, and a lower
precision or a compiled layer for any)."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ..core.meters import signals

__all__ = ["NOTED", "fused", "note_call", "advise_hook"]

#: The classes noted: ``cached=True`` keeps their normalised graph (``gcn_norm``'s output).
NOTED = frozenset({"GCNConv", "APPNP", "GCN2Conv"})
#: The options the rules read, where a class has them.
OPTIONS = (
    "in_channels",
    "out_channels",
    "channels",
    "cached",
    "normalize",
    "add_self_loops",
    "improved",
    "K",
    "alpha",
)


def _parts(edge_index: Any) -> Tuple[Any, ...]:
    """The objects whose identity is the graph: a tensor, or a SparseTensor and its own."""
    if isinstance(edge_index, torch.Tensor):
        return (edge_index,)
    storage = getattr(edge_index, "storage", None)
    if storage is not None and hasattr(storage, "col"):  # torch_sparse.SparseTensor
        return (edge_index, storage._row, storage._rowptr, storage._col, storage._value)
    return (edge_index,)


def note_call(
    layer: Any,
    edge_index: Any,
    edge_weight: Any,
    num_nodes: int,
    inputs: Any = None,
    options: Optional[Callable[[Any], Dict[str, Any]]] = None,
) -> None:
    """One call of ``layer`` on this graph (``num_nodes``: its nodes, from the features;
    ``inputs``: the call's ``(args, kwargs)``, held for the changes timed at the end;
    ``options``: what the rules read of the layer, :func:`_options` by default)."""
    parts = _parts(edge_index)
    if signals.again(layer, inputs, *parts, edge_weight):
        return
    key = signals.graph_key(*parts, edge_weight)
    held = (*parts, edge_weight)
    how = options or _options
    signals.note(layer, "pyg", key, (edge_index, num_nodes), how, _checks, held, inputs)


def _options(layer: Any) -> Dict[str, Any]:
    """The options the rules read, at the layer's first call, and whether its cache keeps
    the normalised graph alone (:data:`NOTED`)."""
    kept = (bool, int, float)
    return {
        "options": {
            k: getattr(layer, k) for k in OPTIONS if isinstance(getattr(layer, k, None), kept)
        },
        "caches_graph": type(layer).__name__ in NOTED,
    }


def _checks(last: Any) -> Dict[str, Any]:
    """What the last call's graph says: its kind, nodes, and how many have a self-loop."""
    edge_index, n = last
    kind = "edge_index"
    if hasattr(getattr(edge_index, "storage", None), "col"):
        kind = "SparseTensor"
    elif isinstance(edge_index, torch.Tensor) and edge_index.layout != torch.strided:
        kind = "torch.sparse"
    facts: Dict[str, Any] = {"input": kind, "nodes": int(n)}
    if kind == "edge_index":
        loops = edge_index[0] == edge_index[1]
        facts["self_loop_nodes"] = int(torch.unique(edge_index[0][loops]).numel())
    return facts


def _timed_only(layer: Any) -> Dict[str, Any]:
    """A layer noted for the changes timed on any layer (lower precision, compiling) alone:
    no option for the rules that read a graph's (self-loops, a cached normalisation), whose
    advice holds for the classes they name, not for, say, GATConv's loops with edge features."""
    return {"options": {}, "caches_graph": False}


def fused(stock: type) -> bool:
    """Whether a PyG class has its own ``message_and_aggregate`` (one sparse product where
    it is given an ``adj_t``, not a message per edge)."""
    from torch_geometric.nn.conv import MessagePassing

    own = getattr(stock, "message_and_aggregate", None)
    return own is not None and own is not MessagePassing.message_and_aggregate


def advise_hook(stock: type) -> Optional[Callable[[Any, tuple, dict], None]]:
    """What a generic class's forward calls with its arguments to note the call (found by the
    stock forward's parameter names: ``x`` and ``edge_index``), else None. A class neither of
    :data:`NOTED` nor :func:`fused` is noted for the changes any layer may take alone."""
    options = None if stock.__name__ in NOTED or fused(stock) else _timed_only
    names = list(inspect.signature(stock.forward).parameters)[1:]
    at = {k: i for i, k in enumerate(names)}
    if "edge_index" not in at or "x" not in at:
        return None
    i_edge, i_weight, i_x = at["edge_index"], at.get("edge_weight"), at["x"]

    def hook(layer: Any, args: tuple, kwargs: dict) -> None:
        def arg(i: Optional[int], name: str) -> Any:
            if name in kwargs:
                return kwargs[name]
            return args[i] if i is not None and i < len(args) else None

        x = arg(i_x, "x")
        if isinstance(x, torch.Tensor):
            edge_index, edge_weight = arg(i_edge, "edge_index"), arg(i_weight, "edge_weight")
            note_call(layer, edge_index, edge_weight, x.size(-2), (args, kwargs), options)

    return hook
