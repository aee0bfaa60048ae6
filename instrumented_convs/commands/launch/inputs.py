"""What a model or conv layer call was given, for the timeline's ``args``: described, and noted
only when it changed, since describing inputs costs far more than comparing a cheap
signature of them (:func:`note_inputs`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from ... import core

__all__ = ["describe", "inputs", "signature", "note_inputs"]

_Tensor = torch.Tensor
_SCALARS = (bool, int, float)
_GRAPHS = frozenset({"SparseTensor", "DGLGraph", "DGLBlock", "DGLHeteroGraph"})


def describe(value: Any, nested: bool = False) -> str:
    """A short text for one input of a call, for the timeline: ``float32[2708, 1433]``, a
    graph's size, a number; the type's name for anything else."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')}[{', '.join(map(str, value.shape))}]"
    kind = type(value).__name__
    try:
        if kind == "SparseTensor":
            return f"SparseTensor[{', '.join(map(str, value.sizes()))}], nnz {value.nnz()}"
        if kind in ("DGLGraph", "DGLBlock", "DGLHeteroGraph"):
            nodes = (
                f"{value.num_src_nodes()} -> {value.num_dst_nodes()}"
                if value.is_block
                else (value.num_nodes())
            )
            return f"{kind}(nodes {nodes}, edges {value.num_edges()})"
    except Exception:  # a graph type of another version: its name is enough
        return kind
    if isinstance(value, (tuple, list)) and not nested:
        return (
            "("
            + ", ".join(describe(v, True) for v in value[:4])
            + (", ...)" if len(value) > 4 else ")")
        )
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return kind


def inputs(args: tuple, kwargs: Dict[str, Any]) -> List[str]:
    """What a module call was given, described (positional first, then ``name=...``)."""
    out = [describe(a) for a in args[:8]]
    out += [f"{k}={describe(v)}" for k, v in list(kwargs.items())[:8]]
    return out


def _part(value: Any, keep: List[Any], nested: bool = False) -> Any:
    """One input's part of a signature: equal parts are described alike (by :func:`describe`)."""
    if isinstance(value, _Tensor):
        return value.dtype, value.shape
    cls = type(value)
    if value is None or cls in _SCALARS:
        return cls, value  # the type too: True == 1 == 1.0, but they are shown apart
    if cls.__name__ in _GRAPHS:
        structure = getattr(value, "_graph", value)  # DGL: replaced when the graph is edited
        keep.append(structure)
        return cls, id(structure)
    if isinstance(value, (tuple, list)) and not nested:
        return cls, len(value), tuple([_part(v, keep, True) for v in value[:4]])
    return cls


def signature(args: tuple, kwargs: Dict[str, Any]) -> Tuple[tuple, List[Any]]:
    """``(signature, objects)``: a cheap key of what a call was given (equal keys: the same
    :func:`inputs`), and the objects whose ids it holds (keep them while it is compared).

    Its parts are a tensor's dtype and shape, a number, a graph's identity: a graph's part
    is not its size but a DGL graph's structure object (which an edit such as ``add_edges``
    replaces), a ``SparseTensor`` itself. The note keeps those objects until the next note
    for the same key replaces it, so that no other graph can take their ids meanwhile; at
    most one set of them per layer and thread."""
    keep: List[Any] = []
    sig = tuple([_part(a, keep) for a in args[:8]])
    if kwargs:
        sig += tuple([(k, _part(v, keep)) for k, v in list(kwargs.items())[:8]])
    return sig, keep


def note_inputs(keys: Tuple[Any, ...], args: tuple, kwargs: Dict[str, Any]) -> None:
    """Note what the call about to start was given, for each of ``keys`` (a layer's scope, or
    ``("region", name)``), where it differs from the last note for that key on this thread.

    Describing a call's inputs (``float32[2708, 1433]``, a graph's size) takes a string per
    tensor and calls into DGL for a graph, so the call's :func:`signature` is compared first
    (``core.noted``): a training loop calls a model with the same shapes again and again,
    and most calls then cost the signature and one comparison. Nothing is lost on the trace:
    a call without a note of its own was given what the last note says, and the trace says
    so in its args."""
    sig, keep = signature(args, kwargs)
    given = None
    for key in keys:
        if not core.noted(key, sig):
            if given is None:
                given = inputs(args, kwargs)
            core.note(key, given, sig, keep)
