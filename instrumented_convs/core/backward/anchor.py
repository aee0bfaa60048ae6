"""The forward side of backward timing: which autograd nodes each step created, so that
:mod:`.hooks` can time each step's backward. The outermost step with autograd recording is
an *anchor*; at its exit :func:`finish` has its backward timed step by step (:func:`walk`)
or only counted (:mod:`.sampling`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List, Optional, Tuple

import torch

from ..frames.stack import Frame, _tls
from ..native import private
from . import sampling
from .hooks import Record, post_hook, pre_hook

__all__ = ["seq_nr", "mark_outputs", "Log", "log_exit", "finish", "chosen", "walk", "failed"]

logger = logging.getLogger(__name__)

#: Whether the C extension chooses and counts at an anchor's exit itself (``_speedups_anchor.c``:
#: the common case of :func:`finish`, with the same outcome); tests and benchmarks turn it off
#: to compare with this module's path.
fast_exit = True


def _none_made() -> int:
    """The counter where torch's cannot be relied on: every step made no node (no
    ``[backward]`` rows, :mod:`..native.private`)."""
    return 0


#: The autograd sequence counter of this thread: the number the next node will get.
#: Autograd numbers every node it creates so, and the nodes a step creates are those numbered
#: from the counter at its entry up to the counter at its exit. (Bound once, the hot path:
#: a nested step reads it twice, and a lookup through ``torch._C`` costs more than the call.)
#: Its backward hooks need the pass's id too: without either, no step makes a node.
seq_nr: Callable[[], int] = (private.graph_task() and private.sequence_counter()) or _none_made
#: Whether :data:`seq_nr` is torch's (else no step makes a node).
counts_nodes = seq_nr is not _none_made


class Log:
    """What the steps nested in one anchor call did, for its walk, relative to the anchor:
    ``items`` are ``(seq0, seq1, entry, depth, mode)`` per step (in exit order; node numbers
    and stack depth counted from the anchor's), so two calls of the same shape have equal
    items; ``outputs`` are the outputs nested steps declared with :func:`mark_outputs`.
    (The C fast path makes logs without calling ``__init__``: it fills the four slots itself.)"""

    __slots__ = ("seq0", "depth0", "items", "outputs")

    def __init__(self, seq0: int, depth0: int) -> None:
        """The log of an anchor entered at sequence number ``seq0`` with ``depth0`` frames open."""
        self.seq0 = seq0
        self.depth0 = depth0
        self.items: List[Tuple[int, int, Any, int, int]] = []
        self.outputs: List[Any] = []


def mark_outputs(out: Any) -> Any:
    """Tell the innermost open step which tensors it produced; returns ``out`` unchanged.

    ``out``: a tensor, or tuples, lists and dicts of them (two levels deep). Layers and
    ``@step`` functions call it on their return value; a ``with step()`` block calls it on
    its result before the block ends. A step's backward is found from these tensors only:
    a step that marks none (and has no nested step that does) gets no backward rows. With
    no step open, or while disabled, it does nothing.
    """
    top = _tls.stack[-1]
    if top.seq0 >= 0:
        top.outputs = out
    return out


def log_exit(frame: Frame, stack: List[Frame], ok: bool) -> None:
    """At a logging step's exit: log its node range in its anchor's log, or finish the anchor.

    ``ok`` is False when the step raised (nothing is hooked then). The frame is reused by
    later steps, so it is emptied here and holds no tensor afterwards.
    """
    seq0, log, outputs = frame.seq0, frame.log, frame.outputs
    frame.seq0, frame.log, frame.outputs = -1, None, None
    seq1 = seq_nr()
    if not ok or seq1 == seq0:
        return
    if not frame.anchor:
        base = log.seq0
        log.items.append(
            (seq0 - base, seq1 - base, frame.entry, len(stack) - log.depth0, frame.mode)
        )
        if outputs is not None:
            log.outputs.append(outputs)
        return
    try:
        finish(log, seq1, frame.entry, frame.mode, outputs, stack)
    except Exception:  # never break the user's forward over its timing
        logger.exception(
            "instrumented_convs: setting up the backward of %s failed", frame.entry.path
        )


def failed(entry: Any, exc: BaseException) -> None:
    """Log that setting up the backward of ``entry`` failed (the C fast path calls it)."""
    logger.error(
        "instrumented_convs: setting up the backward of %s failed", entry.path, exc_info=exc
    )


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


def finish(
    log: Log, seq1: int, entry: Any, mode: int, outputs: Any, fwd_stack: List[Frame]
) -> None:
    """At an anchor's exit: time its backward step by step, or count it.

    An anchor is a layer's own step, a ``@step`` function, or a ``with step()`` block. Its
    backward is found from the tensors it produced, which it declares with
    :func:`mark_outputs`, and from those its nested steps declared (in ``log``); ``outputs``
    are the anchor's own (None: it declared none). An anchor that declared nothing, with no
    nested step that did, has no backward rows: nothing says which tensors are its own.
    :func:`.sampling.choose` decides: timed (:func:`walk`), or counted (one hook on the
    anchor's newest output node counts the call for every step that the timed calls of the
    same graph shape showed a backward for).
    """
    shape = (seq1 - log.seq0, mode, tuple(log.items))
    template, how = sampling.choose(entry, shape)
    chosen(log, seq1, entry, mode, outputs, fwd_stack, shape, template, how)


def chosen(
    log: Log,
    seq1: int,
    entry: Any,
    mode: int,
    outputs: Any,
    fwd_stack: List[Frame],
    shape: Any,
    template: Optional[sampling.Template],
    how: int,
) -> None:
    """The rest of :func:`finish` once :func:`.sampling.choose` said ``how`` (the C fast path
    of an anchor's exit chooses, counts the common case itself and calls this for the others)."""
    seq0 = log.seq0
    if how == sampling.COUNT and type(outputs) is torch.Tensor:
        node = outputs.grad_fn  # the common case: one output, the anchor's newest node
        if node is not None and node._sequence_nr() == seq1 - 1:
            sampling.count(outputs, node, template, fwd_stack)
            return
    roots: List[Any] = []
    explicit = outputs is not None
    _tensors(outputs, roots)
    for out in log.outputs:
        _tensors(out, roots)
    if how == sampling.COUNT:
        newest = _newest(roots, seq0, seq1)
        if newest is not None and not _several(outputs):
            sampling.count(newest[0], newest[1], template, fwd_stack)
            return
        # No output of its own to count on, or several (a heterogeneous layer's, per node
        # type): the loss may use some only, autograd skip the newest's node and a count hook
        # on it never run; time this call instead.
        how = sampling.CENSUS
    recs = walk(log, seq1, entry, mode, roots, explicit, fwd_stack, how == sampling.SAMPLED)
    if template is None:
        sampling.remember(entry, shape, recs)


def _several(outputs: Any) -> bool:
    """Whether an anchor declared more than one tensor as its outputs."""
    if outputs is None or type(outputs) is torch.Tensor:
        return False
    found: List[Any] = []
    _tensors(outputs, found)
    return len(found) > 1


def _newest(roots: List[Any], seq0: int, seq1: int) -> Optional[Tuple[Any, Any]]:
    """``(tensor, node)`` of the root whose node is the anchor's newest, if one is its own."""
    best = None
    for t in roots:
        node = t.grad_fn
        s = node._sequence_nr()
        if seq0 <= s < seq1 and (best is None or s > best[0]):
            best = (s, t, node)
    return None if best is None else (best[1], best[2])


def walk(
    log: Log,
    seq1: int,
    entry: Any,
    mode: int,
    roots: List[Any],
    explicit: bool,
    fwd_stack: List[Frame],
    sampled: bool,
) -> List[Record]:
    """Walk the anchor's autograd graph and hook each step's first and last backward node.

    The graph is walked back from ``roots`` over the nodes of the anchor's own range only,
    each node is given to the innermost step that created it, and each step's first and last
    backward node is hooked (:mod:`.hooks`): at most two hooks per step, shared between
    nested steps. Nothing here keeps a node or a tensor after the anchor's exit, but the
    hooks. Returns the records of the anchor and its nested steps, parents first; those whose
    backward was found have ``hooked`` set. Without explicit outputs, if the anchor's newest
    node is not reachable from ``roots``, its own record is dropped (its nested steps keep
    theirs) rather than time a part of it. ``sampled``: this call was chosen at random for
    timing (its records say so when they record).
    """
    seq0 = log.seq0
    owner: List[Any] = [None] * (seq1 - seq0)
    recs: List[Record] = []
    chain: List[Record] = []
    items = log.items + [(0, seq1 - seq0, entry, 0, mode)]
    tid = threading.get_ident()
    for s0, s1, e, depth, m in reversed(items):  # parents first (depths relative to the anchor)
        while chain and chain[-1].depth >= depth:
            chain.pop()
        r = Record(e, chain[-1] if chain else None, depth, m, fwd_stack, sampled)
        r.link = (tid, seq0 + s0)  # the forward call's thread and entry (see storage.timeline)
        chain.append(r)
        recs.append(r)
        owner[s0:s1] = [r] * (s1 - s0)  # inner steps overwrite outer ones
    seen = set()
    todo = [t.grad_fn for t in roots]
    while todo:
        node = todo.pop()
        s = node._sequence_nr() - seq0
        if s < 0 or s >= seq1 - seq0 or s in seen:  # outside the anchor (or AccumulateGrad)
            continue
        seen.add(s)
        r = owner[s]
        if r.hi is None or s > r.hi[0]:
            r.hi = (s, node)
        if r.lo is None or s < r.lo[0]:
            r.lo = (s, node)
        for n, _ in node.next_functions:
            if n is not None:
                todo.append(n)
    if not explicit and (seq1 - 1 - seq0) not in seen:
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
            r.hooked = True
            starts.setdefault(r.hi[0], (r.hi[1], []))[1].append(r)
            ends.setdefault(r.lo[0], (r.lo[1], []))[1].append(r)
        r.hi = r.lo = None  # keep no node: the hooks, held by the nodes, hold the records
    for node, rs in starts.values():
        node.register_prehook(pre_hook(tuple(rs)))
    for node, rs in ends.values():
        node.register_hook(post_hook(tuple(reversed(rs))))
    return recs
