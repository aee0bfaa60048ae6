"""The forward side of backward timing: which autograd nodes each step created.

Autograd numbers every node it creates with a per-thread sequence number, so the nodes a
step creates are those numbered from the counter at its entry up to the counter at its exit.
The outermost step that can say what it produced is an *anchor*: a layer's own step, a
``@step`` function (both call :func:`mark_outputs` on their return value), or a
``with step()`` block, whose outputs are looked for among the caller's local variables.
Steps nested in an anchor log their number ranges (:func:`log_exit`); at the anchor's exit
:func:`finish` walks the autograd graph back from its outputs over the nodes of its own
range only, gives each node to the innermost step that created it, and hooks each step's
first and last backward node (:mod:`._backward`): at most two hooks per step, shared
between nested steps. Nothing here keeps a node or a tensor after the walk.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable, List, Tuple

import torch

from ._backward import Record, post_hook, pre_hook
from ._stack import Frame, _tls

__all__ = ["seq_nr", "mark_outputs", "log_exit", "finish"]

logger = logging.getLogger(__name__)

#: The autograd sequence counter of this thread: the number the next node will get.
seq_nr: Callable[[], int] = torch._C._autograd._get_sequence_nr


def mark_outputs(out: Any) -> Any:
    """Tell the innermost open step which tensors it produced; returns ``out`` unchanged.

    Layers and ``@step`` functions call it on their return value, so their backward is found
    from exactly those outputs instead of the caller's local variables.
    """
    top = _tls.stack[-1]
    if top.seq0 >= 0:
        top.outputs = out
    return out


def log_exit(frame: Frame, stack: List[Frame], entry: Any, mode: int, ok: bool) -> None:
    """At a logging step's exit: log its node range for its anchor, or walk it if it is one.

    ``ok`` is False when the step raised (nothing is hooked then). The frame is reused by
    later steps, so it is emptied here and holds no tensor afterwards.
    """
    seq0, log, outputs, anchor = frame.seq0, frame.log, frame.outputs, frame.anchor
    frame.seq0, frame.log, frame.outputs = -1, None, None
    seq1 = seq_nr()
    if not ok or seq1 == seq0:
        return
    item = (seq0, seq1, entry, len(stack), mode, outputs)
    if not anchor:
        log.append(item)
        return
    try:
        finish(item, log, stack, caller_depth=3)
    except Exception:  # never break the user's forward over its timing
        logger.exception("instrumented_convs: setting up the backward of %s failed", entry.path)


def _tensors(value: Any, out: List[Any], depth: int = 0) -> None:
    """Collect the tensors of ``value`` that have a ``grad_fn`` (in tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None:
            out.append(value)
    elif depth < 2 and isinstance(value, (tuple, list)):
        for v in value:
            _tensors(v, out, depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for v in value.values():
            _tensors(v, out, depth + 1)


def finish(anchor: Tuple[Any, ...], log: List[Tuple[Any, ...]], fwd_stack: List[Frame],
           caller_depth: int) -> None:
    """At an anchor's exit: walk its autograd graph and hook the steps' first/last nodes.

    ``anchor`` and each item of ``log`` (nested steps, in exit order) are
    ``(seq0, seq1, entry, depth, mode, outputs)``. Without outputs of its own, the anchor's
    are looked for among the local variables of the frame ``caller_depth`` levels up (from
    here); if its newest node is not reachable from them, its own record is dropped (its
    nested steps keep theirs) rather than time a part of it.
    """
    seq0, seq1 = anchor[0], anchor[1]
    roots: List[Any] = []
    explicit = anchor[5] is not None
    _tensors(anchor[5], roots)
    for item in log:
        _tensors(item[5], roots)
    if not explicit:
        _tensors(list(sys._getframe(caller_depth).f_locals.values()), roots)
    owner: List[Any] = [None] * (seq1 - seq0)
    recs: List[Record] = []
    chain: List[Record] = []
    for s0, s1, entry, depth, mode, _ in reversed(log + [anchor]):  # parents first
        while chain and chain[-1].depth >= depth:
            chain.pop()
        r = Record(entry, chain[-1] if chain else None, depth, mode, fwd_stack)
        chain.append(r)
        recs.append(r)
        owner[s0 - seq0:s1 - seq0] = [r] * (s1 - s0)  # inner steps overwrite outer ones
    seen = set()
    todo = [t.grad_fn for t in roots]
    while todo:
        node = todo.pop()
        s = node._sequence_nr()
        if s < seq0 or s >= seq1 or s in seen:  # outside the anchor (or AccumulateGrad)
            continue
        seen.add(s)
        r = owner[s - seq0]
        if r.hi is None or s > r.hi[0]:
            r.hi = (s, node)
        if r.lo is None or s < r.lo[0]:
            r.lo = (s, node)
        for n, _ in node.next_functions:
            if n is not None:
                todo.append(n)
    if not explicit and (seq1 - 1) not in seen:
        root = recs[0]
        root.hi = root.lo = None
        for r in recs:
            if r.parent is root:
                r.parent = None
    for r in reversed(recs):  # children before parents: a parent spans its children
        p = r.parent
        if r.hi is None or p is None:
            continue
        if p.hi is None or r.hi[0] > p.hi[0]:
            p.hi = r.hi
        if p.lo is None or r.lo[0] < p.lo[0]:
            p.lo = r.lo
    starts: dict = {}
    ends: dict = {}
    for r in recs:  # parents first: starts open outer steps first
        if r.hi is not None:
            starts.setdefault(r.hi[0], (r.hi[1], []))[1].append(r)
            ends.setdefault(r.lo[0], (r.lo[1], []))[1].append(r)
        r.hi = r.lo = None  # keep no node: the hooks, held by the nodes, hold the records
    for node, rs in starts.values():
        node.register_prehook(pre_hook(tuple(rs)))
    for node, rs in ends.values():
        node.register_hook(post_hook(tuple(reversed(rs))))
