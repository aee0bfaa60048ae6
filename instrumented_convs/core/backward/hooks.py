"""The backward of steps, while autograd runs: the node hooks that time each step's backward
(:func:`pre_hook`, :func:`post_hook`), so that the backward pass has rows that mirror the
forward's. :mod:`.anchor` chooses the nodes; a hook opens or closes a frame on the thread
that runs it (:mod:`~instrumented_convs.core.frames.lifecycle`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Set, Tuple

import torch

from ..clocks import cpu as clock
from ..frames import lifecycle
from ..frames.stack import CPU, SAMPLED, Frame, _tls
from ..native import private, speedups
from ..settings import switches
from ..storage.entry import BACKWARD_MARK
from ..storage.registry import backward_key, backward_parent, registry

__all__ = ["Record", "pre_hook", "post_hook", "close_stale", "close_above", "live"]

logger = logging.getLogger(__name__)

# Bound once: the hot path (benchmarks/instructions.py): every timed backward step's start and
# end read it, and a lookup through ``torch._C`` costs more than the call.
# (torch's, checked by its canary: without it no step makes a node and no hook runs, .anchor)
_task_id: Callable[[], int] = private.graph_task() or (lambda: -1)
live: Set[int] = set()  # graph tasks that started a backward step and are not freed yet


class Record:
    """The backward of one call of one step: where it records and its state in a pass.

    :mod:`.anchor` hooks the first node of the call's backward (the highest autograd
    sequence number among the nodes it created) and the last (the lowest). On one thread
    autograd runs the nodes of a graph in decreasing sequence number, so a step's backward is
    one contiguous run, nested exactly like its forward: the pre-hook opens it (clock, NVTX
    range and profiler label named ``<step> [backward]``, a frame on the running thread's
    stack) and the post-hook closes it. Records are referenced by the hooks only, so they
    die with the graph.
    """

    __slots__ = (
        "name",
        "key",
        "scope",
        "kind",
        "parent",
        "depth",
        "cuda",
        "label",
        "fwd_stack",
        "frame",
        "task",
        "bw",
        "bw_task",
        "hi",
        "lo",
        "hooked",
        "sampled",
        "link",
    )

    def __init__(
        self,
        entry: Any,
        parent: Optional["Record"],
        depth: int,
        mode: int,
        fwd_stack: List[Frame],
        sampled: bool = False,
    ) -> None:
        self.name, self.kind = entry.name, entry.kind
        self.key = entry.key if entry.phase == "forward" else entry.key[0]
        self.scope = None if isinstance(self.key, str) else self.key[1]
        self.parent, self.depth = parent, depth
        self.cuda = mode != CPU
        self.label = entry.name + BACKWARD_MARK
        self.fwd_stack = fwd_stack
        self.frame: Optional[Frame] = None  # open in pass ``task`` on some thread's stack
        self.task = -1
        self.bw: Any = None  # the backward entry, valid for pass ``bw_task``
        self.bw_task = -1
        self.hi: Optional[Tuple[int, Any]] = None  # (seq, node) while the graph is walked
        self.lo: Optional[Tuple[int, Any]] = None
        self.hooked = False  # its first and last backward nodes are hooked
        self.sampled = sampled  # its call was chosen at random for timing (see .sampling)
        #: (forward thread, autograd sequence number at the forward's entry): pairs the
        #: backward with its forward call on the timeline (see storage.timeline); None: unknown.
        self.link: Optional[Tuple[int, int]] = None


def _bw_entry(r: Record, task: int, stack: List[Frame]) -> Any:
    """The registry entry of ``r``'s backward in pass ``task``: its parent's, mirrored.

    The backward of an anchor (the outermost step of a walk) nests under the step open, when
    the backward starts, on the thread running it (the user's ``region("backward")`` on
    CPU). On CUDA, autograd runs the nodes on its own device thread, where nothing is open:
    the rows nest under the step open on the thread that ran the forward (normally the
    caller, blocked in ``backward()``). Below the anchor, paths mirror the forward paths
    (regions skipped).
    """
    if r.bw_task == task:
        return r.bw
    if r.parent is not None:
        parent = _bw_entry(r.parent, task, stack)
    else:
        parent = backward_parent(stack, r.fwd_stack)
    entry = parent.children.get(backward_key(r.key))
    if entry is None:
        entry = registry.child(parent, r.name, r.scope, r.kind, "backward")
    r.bw, r.bw_task = entry, task
    return entry


class _TaskEnd:
    """Queued at the end of a graph task: closes steps it left open; its death ends the task.

    A pass that does not run a step's last node (``torch.autograd.grad`` pruning it, an
    output the loss does not use) closes the step here: on the CPU clock, as ended with the
    last of this pass's steps that closed after it began; else (a CUDA event cannot be put
    back in time) untimed. A backward that raises leaves frames whose
    graph task has died, which is seen when this object is freed: they are closed, as
    errors, right then if they are on the freeing thread, else by an enclosing step's exit
    or at the next step or hook on that thread (:func:`close_stale`).
    """

    __slots__ = ("task", "__weakref__")

    def __init__(self, task: int) -> None:
        self.task = task
        live.add(task)

    def __call__(self) -> None:
        try:
            stack = _tls.stack
            last = lifecycle.closed.pop(self.task, None)
            for frame in reversed([f for f in stack if f.task == self.task]):  # pruned last nodes
                stack.remove(frame)
                if last is not None and frame.mode == CPU and last[0] > frame.start:
                    # ended with the last of its steps that ran
                    lifecycle.close_backward(frame, *last)
                else:
                    _abandon(frame, error=False)
        except Exception:  # never break the user's backward
            logger.exception("instrumented_convs: closing backward steps failed")

    def __del__(self) -> None:
        live.discard(self.task)
        lifecycle.closed.pop(self.task, None)
        try:  # a backward that raised: close its frames now if they are on this thread
            stack = _tls.stack
            if stack[-1].task == self.task:
                close_stale(stack)
        except Exception:  # never fail in a finaliser (e.g. at interpreter exit)
            pass


def _abandon(frame: Frame, error: bool) -> None:
    """Close a backward frame whose last node did not run: untimed (an error if it raised).

    The frame is reused by later steps: it lets go of its record, so the record dies with
    its graph.
    """
    r = frame.owner
    frame.task = frame.owner = None
    mine = r.frame is frame
    if mine:
        r.frame = None
    lifecycle.abandon_frame(frame, error, count=mine)


def close_stale(stack: List[Frame]) -> None:
    """Close the backward frames on top of ``stack`` whose graph task has died (it raised)."""
    while True:
        top = stack[-1]
        if top.task is None or top.task in live:
            return
        stack.pop()
        _abandon(top, error=True)


def close_above(stack: List[Frame], owner: Any) -> None:
    """Close the backward frames above ``owner``'s frame: its block ended, so they died.

    Nothing is closed when ``owner`` has no frame on this stack.
    """
    below = next((i for i in range(len(stack) - 1, 0, -1) if stack[i].owner is owner), None)
    if below is None:
        return
    for i in range(len(stack) - 1, below, -1):
        frame = stack[i]
        if frame.task is not None:
            del stack[i]
            _abandon(frame, error=True)


def _start(records: Tuple[Record, ...], t_in: int) -> None:
    """The pre-hook of a step's first node: open the backward of ``records``, outer first
    (``t_in``: the CPU clock when the hook began)."""
    if not (switches.enabled and switches.backward):
        return
    task = _task_id()
    if task < 0:  # inside a backward pass: torch's call changed (native.private)
        return private.task_failed(task)
    stack = _tls.stack
    if stack[-1].task is not None and stack[-1].task not in live:
        close_stale(stack)
    if task not in live:
        torch.autograd.Variable._execution_engine.queue_callback(_TaskEnd(task))
    parent = records[0].parent  # (the common case: open in this pass, and on top)
    if parent is not None and parent.task != task:
        records = _unopened(parent, task) + records
        parent = records[0].parent
    top = stack[-1]
    if top.task == task and top.owner is not parent:
        _close_ended(stack, records[0], t_in)
    for r in records:
        if r.frame is not None:
            if r.task == task:
                continue
            old = r.frame  # open since a pass that died elsewhere: untimed
            if old in stack:
                stack.remove(old)
                _abandon(old, error=True)
            r.frame = None
        entry = _bw_entry(r, task, stack)
        top = stack[-1]
        frame = top.spare
        if frame is None:
            frame = top.spare = Frame()
        frame.entry, frame.owner, frame.task, frame.cuda, frame.dev = entry, r, task, r.cuda, None
        frame.log, frame.seq0, frame.anchor, frame.outputs = None, -1, False, None
        lifecycle.open_frame(frame, r.label, r.cuda, None)
        if frame.mode == CPU:  # the tool's time so far, this hook's up to the frame's start
            frame.own = stack[0].own + (frame.start - t_in)
        if r.sampled:
            frame.flags |= SAMPLED
        stack.append(frame)
        r.frame, r.task = frame, task


def _unopened(parent: Optional[Record], task: int) -> Tuple[Record, ...]:
    """The steps around a step whose backward begins that are not open in this pass, outer
    first: autograd skipped their first node (an output the loss does not use), so they open
    with the first of their steps that runs."""
    out: List[Record] = []
    while parent is not None and parent.task != task:  # (closed in this pass: not again)
        out.append(parent)
        parent = parent.parent
    return tuple(reversed(out))


def _close_ended(stack: List[Frame], first: Record, t1: int) -> None:
    """Close, as ended at ``t1``, the backward frames of this pass on top of ``stack`` whose
    step is not ``first``'s nor one around it: autograd skipped its last node (an output of
    the step that the loss does not use, a heterogeneous layer's relation), and a step
    outside it begins, so every node of it that runs has run (one thread runs a pass's nodes
    in decreasing sequence number). Else it would stay open to the pass's end, untimed, the
    steps after it nested inside it."""
    around = set()
    r: Optional[Record] = first
    while r is not None:
        around.add(id(r))
        r = r.parent
    task, thread = stack[-1].task, first.fwd_stack
    while (
        stack[-1].task == task
        and id(stack[-1].owner) not in around
        and stack[-1].owner.fwd_stack is thread  # (sequence numbers are a thread's own)
    ):
        lifecycle.close_backward(stack.pop(), t1)


def _end(records: Tuple[Record, ...], t1: int) -> None:
    """The post-hook of a step's last node: close the backward of ``records``, inner first
    (``t1``: the CPU clock, read first when the hook began)."""
    if not (switches.enabled and switches.backward):
        return
    task = _task_id()
    if task < 0:  # (nothing was opened: _start)
        return
    stack = _tls.stack
    for r in records:
        frame = r.frame
        if frame is None and r.task == task:  # closed already: a step outside it began
            continue
        if frame is None or r.task != task:  # its first node did not run in this pass
            registry.record_untimed(_bw_entry(r, task, stack))
            continue
        r.frame = None
        if stack[-1] is frame:
            stack.pop()
        elif frame in stack:
            stack.remove(frame)
        else:  # opened on another thread (a graph on two devices): time it, close it there
            lifecycle.close_elsewhere(frame, t1, r.link)
            continue
        frame.task = frame.owner = None  # the frame is reused: let go of the record
        own = stack[0].own - frame.own if frame.mode == CPU else 0
        lifecycle.close_frame(frame, t1, False, r.link, own)
        lifecycle.closed[task] = (t1, stack[0].own)


# The tool's own time. Hooks run inside the backward of the steps around them: a step's
# backward on CPU would count, besides its own nodes, the hooks of every step below it (a
# few us each, more than a small node takes). So each hook adds the time it ran, clock to
# clock, to its thread's total (``Frame.own`` of the stack's bottom), a CPU backward frame
# remembers that total at its start, and its recorded time leaves out what the total grew
# by meanwhile. What no clock inside a hook sees stays in the step around: autograd calling
# it, a fraction of what a hook costs (benchmarks/step_residual.py; docs/performance.md has
# the figures). Regions (one around ``loss.backward()``) keep the time as it passed.


def _start_safe(records: Tuple[Record, ...], t_in: int) -> None:
    """:func:`_start`, never raising into the user's backward."""
    try:
        _start(records, t_in)
    except Exception:
        logger.exception("instrumented_convs: starting a backward step failed")


def _end_safe(records: Tuple[Record, ...], t1: int) -> None:
    """:func:`_end`, never raising into the user's backward."""
    try:
        _end(records, t1)
    except Exception:
        logger.exception("instrumented_convs: ending a backward step failed")


def _timed_hook(fn: Callable[[Tuple[Record, ...], int], None], records: Tuple[Record, ...]) -> Any:
    """A node hook running ``fn(records, t_in)``, its own time added to the thread's: the
    C extension's ``BackwardHook`` (no Python frame around the clock readings), else this."""
    if speedups is not None:
        return speedups.BackwardHook(fn, records)

    def hook(*grads: Any) -> None:
        t_in = clock.cpu_now()
        fn(records, t_in)
        _tls.stack[0].own += clock.cpu_now() - t_in

    return hook


def pre_hook(records: Tuple[Record, ...]) -> Callable[[Any], None]:
    """The hook on a step's first backward node (outer records first)."""
    return _timed_hook(_start_safe, records)


def post_hook(records: Tuple[Record, ...]) -> Callable[[Any, Any], None]:
    """The hook on a step's last backward node (inner records first)."""
    return _timed_hook(_end_safe, records)
