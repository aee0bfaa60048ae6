"""The changes of DGL layers timed at the end of an advised run (:mod:`..layers.trials`).

``cache-normalization``: a ``GraphConv`` with ``norm='both'`` (or ``'right'``) normalises by
the degrees at every call; DGL's own recipe computes the normalised edge weights once with
``EdgeWeightNorm`` and passes them to a ``GraphConv(norm='none')``: a weighted message
instead of the scaling, which can be slower (measured here: an epoch 2.7 times slower on
the CPU), hence timed, never assumed.

``graph-formats``: a graph made anew for every call (``dgl.add_self_loop`` or ``dgl.graph``
inside the loop) has its sparse formats made inside the layer's call, each time; made once
(``create_formats_()``), kept, they are not. Timed: the layer given a copy of its last graph
made anew before each call (outside its time), as the user's calls were, against the layer
given a copy whose formats were made.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Dict, Optional

import torch

from ..layers.trials import Change, register

__all__ = ["cached_norm", "graph_formats"]


def cached_norm(layer: Any, facts: Dict[str, Any]) -> Optional[Change]:
    """The change to weights normalised once for a ``GraphConv`` given no edge weights and
    ``norm`` of ``'both'`` or ``'right'``, or None."""
    from dgl.nn.pytorch import EdgeWeightNorm, GraphConv

    if not isinstance(layer, GraphConv) or layer._norm not in ("both", "right"):
        return None
    (graph, feat), kwargs = facts["inputs"]
    if kwargs.get("edge_weight") is not None or not isinstance(feat, torch.Tensor):
        return None
    t0 = time.perf_counter()
    ones = torch.ones(graph.num_edges(), device=feat.device)
    weights = EdgeWeightNorm(norm=layer._norm)(graph, ones)
    convert_s = time.perf_counter() - t0
    changed = copy.deepcopy(layer)
    changed._norm = "none"
    return Change(
        "cache-normalization",
        f"norm_w = EdgeWeightNorm(norm={layer._norm!r})(graph, torch.ones(graph.num_edges())) "
        f"once, then GraphConv(..., norm='none') called with edge_weight=norm_w",
        ((graph, feat), dict(kwargs, edge_weight=weights)),
        layer=changed,
        convert_s=convert_s,
    )


register("dgl", "cache-normalization", cached_norm)


def _anew(graph: Any) -> Any:
    """A copy of a homogeneous graph as ``dgl.graph`` makes it: its edges, no format made
    but COO."""
    import dgl

    src, dst = graph.edges()
    return dgl.graph((src, dst), num_nodes=graph.num_nodes())


def graph_formats(layer: Any, facts: Dict[str, Any]) -> Optional[Change]:
    """The change to one graph, its formats made once, for a ``GraphConv`` given a graph made
    anew (its formats still to make) at more than one call, or None."""
    from dgl.nn.pytorch import GraphConv

    if not isinstance(layer, GraphConv) or facts.get("fresh_graph_calls", 0) < 2:
        return None
    (graph, feat), kwargs = facts["inputs"]
    if not isinstance(feat, torch.Tensor) or graph.is_block or not graph.is_homogeneous:
        return None
    kept = _anew(graph)
    kept.create_formats_()
    return Change(
        "graph-formats",
        "make the graph once, before the loop, and give every call that one graph "
        "(graph.create_formats_() there makes its sparse formats at once)",
        ((kept, feat), kwargs),
        remake=lambda: ((_anew(graph), feat), kwargs),
    )


register("dgl", "graph-formats", graph_formats)
