"""One lifecycle for every timed frame, forward steps (``steps.step``) and backward steps
(``backward.hooks``) alike: :func:`open_frame` and :func:`close_frame`, so that there is one
Python path to keep fast and one place to change. The clock is read inside the NVTX range
and the profiler label, so the bookkeeping stays outside the measured time.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from ..clocks import cpu as clock
from ..clocks import events
from ..labels import nvtx, profiler
from ..native import private
from ..settings import switches
from ..storage import registry as registry_module
from ..storage import timeline
from .stack import CPU, CUDA, LABELLED, PUSHED, RANGED, SAMPLED, UNTIMED, Frame, _tls

__all__ = [
    "open_frame",
    "close_frame",
    "close_elsewhere",
    "abandon_frame",
    "close_backward",
    "close_ended",
    "closed",
]

# The registry, assigned rather than imported: CPython 3.11 compiles ``name.method(...)`` on
# an imported name as an attribute load, a bound method made at every call (the hot path:
# benchmarks/instructions.py), and on an assigned name as a method call.
registry = registry_module.registry


def open_frame(frame: Frame, label: str, cuda: bool, dev: Optional[int]) -> None:
    """Start ``frame``: an NVTX range (when ``labels.nvtx`` pushes them) and a profiler label
    (only while a torch profiler records) named ``label``, then the clock, last:
    ``frame.start`` (the CPU clock), or, with ``cuda``, ``frame.event`` (a CUDA event on the
    current stream of device ``dev``; None: the current device) after ``frame.start``.

    If opening the label fails, the range is popped again and the exception propagates (the
    frame is then not open).
    """
    flags = 0
    if nvtx.live:
        entry = frame.entry  # its layer, kind and clock, for a report read back (report.nsys)
        nvtx.push(label, entry.scope, entry.kind == "region", not cuda)
        flags = PUSHED
        if switches.ranges:  # the range is all it records: no label, no clock, no event
            frame.flags, frame.mode, frame.event = PUSHED | RANGED, CPU, None
            frame.start = clock.cpu_now()  # (the tool's own time of the steps around)
            return
    if switches.record_function and profiler.profiler_state._is_profiler_enabled:
        try:
            frame.rf = profiler.open_record_function(label)
        except BaseException:
            if flags:
                nvtx.pop()
            raise
        flags |= LABELLED
    frame.flags = flags
    if not cuda:
        frame.mode = CPU
        frame.start = clock.cpu_now()  # the clock last
        return
    event = None
    # The C clock sees a capture itself; the twin asks at call time (tests replace it).
    if events.native() or not torch.cuda.is_current_stream_capturing():
        try:
            device = events.current_device() if dev is None else dev
            slot = None
            if timeline.events is not None:  # the device's reference
                slot = timeline.gpu_ref(device)
            frame.gpu = slot
            event = events.record_event(device)  # None: the C clock saw a capture
            frame.event_device = device
        except RuntimeError:  # e.g. a pending device error: time nothing, fail nothing
            event = None
    frame.mode = UNTIMED if event is None else CUDA
    frame.event = event
    # the CPU start after the start event: the host time (and the timeline's) leaves it out
    frame.start = clock.cpu_now()


def close_frame(frame: Frame, t1: int, error: bool, link: Any = None, own: int = 0) -> None:
    """Stop ``frame``'s clock, close its label and range (the reverse order of
    :func:`open_frame`), and record its time.

    ``t1`` is the CPU clock, read by the caller before anything else (a CUDA frame records
    its end event here, first). ``error``: the frame ended with an exception (counted; the
    time is recorded all the same). ``link``: what pairs the call with its forward on the
    timeline (a backward's; a forward's is its ``seq0``). ``own``: ns of the tool's own code
    that ran inside the frame (a CPU frame's time leaves them out; the timeline shows the
    frame where it ran). The frame may be reused as soon as this returns: it lets go of its
    profiler handle and of its events. A range that holds ``own`` and more of the tool's time
    since ``t1`` closes with a mark of the step's time (``labels.nvtx.TIME_MARK``), which a
    report read back takes as the call's, not the range's duration.
    """
    mode = frame.mode
    end = None
    if mode == CUDA:  # the clock first: on the device of the start event
        try:
            end = events.record_event(frame.event_device)
        except RuntimeError:
            end = None
        if end is None:  # a device error, or a capture begun inside the step
            mode = UNTIMED
    flags = frame.flags
    if flags & PUSHED and not flags & RANGED and own + clock.cpu_now() - t1 >= nvtx.TIME_FLOOR_NS:
        nvtx.timed(t1 - frame.start - own)  # the range holds more than the clock: its time
    try:
        _close_label_and_range(frame, flags)
    finally:
        _record_frame(frame, mode, t1, end, error, frame.seq0 if link is None else link, own)


def close_elsewhere(frame: Frame, t1: int, link: Any = None) -> None:
    """Record ``frame``'s time without closing its label or range: it was opened on another
    thread (a backward on two devices), whose stacks only that thread may touch."""
    mode, end = frame.mode, None
    if mode == CUDA:
        try:
            end = events.record_event(frame.event_device)
        except RuntimeError:
            end = None
        if end is None:
            mode = UNTIMED
    _record_frame(frame, mode, t1, end, False, link)


def _record_frame(
    frame: Frame,
    mode: int,
    t1: int,
    end: Any,
    error: bool,
    link: Any,
    own: int = 0,
) -> None:
    """Record a closed frame's time in the registry, and on the timeline when it records
    (a frame of the ranges mode records nothing)."""
    if frame.flags & RANGED:
        return
    sampled = bool(frame.flags & SAMPLED)
    if mode == CPU:
        if sampled:
            registry.record_sampled(frame.entry, t1 - frame.start - own)
        else:
            registry.record(frame.entry, t1 - frame.start - own, error)
        if timeline.events is not None:
            timeline.add(frame.entry, frame.start, t1, link)
        return
    start, frame.event = frame.event, None  # the frame is reused: it keeps no event
    if mode == CUDA:
        slot, frame.gpu = frame.gpu, None  # see open_frame
        registry.record_pending(
            frame.entry,
            start,
            end,
            frame.event_device,
            error,
            sampled,
            slot,
            t1,
            t1 - frame.start - own,
        )
        if slot is not None and timeline.events is not None:
            timeline.add(frame.entry, frame.start, t1, link, slot)
    else:
        if start is not None:  # an end that could not be recorded: the start is reusable
            events.give_back(frame.event_device, start)
        registry.record_untimed(frame.entry, error)


def abandon_frame(frame: Frame, error: bool, count: bool = True) -> None:
    """Close ``frame``'s label and range; its end never came: count the call as untimed
    (unless ``count`` is False: another frame already counts it)."""
    frame.event = None  # its events never go back to the pool: the frame keeps none
    try:
        _close_label_and_range(frame, frame.flags)
    finally:
        if count:
            registry.record_untimed(frame.entry, error)


def _close_label_and_range(frame: Frame, flags: int) -> None:
    """Close ``frame``'s profiler label and pop its NVTX range (the range even if the label
    raises)."""
    try:
        if flags & LABELLED:
            rf, frame.rf = frame.rf, None
            rf.__exit__(None, None, None)
    finally:
        if flags & PUSHED:
            nvtx.pop()


#: graph task -> the CPU clock when a backward step of it last closed on its thread, and the
#: thread's tool time then: a step still open at the task's end (autograd skipped its last
#: node) ended then (``backward.hooks``)
closed: Dict[int, Tuple[int, int]] = {}
_task_id = private.graph_task() or (lambda: -1)  # (torch's, checked: native.private)


def close_backward(frame: Frame, t1: int, own_total: Optional[int] = None) -> None:
    """Close the backward ``frame`` (taken off its stack already) as ended at ``t1``, timed;
    ``own_total``: the thread's tool time then (default: now).
    Its record (``frame.owner``) lets go of it and keeps its pass: the step's last node, if
    it runs, then closes nothing."""
    owner = frame.owner
    if owner.frame is frame:
        owner.frame = None
    task = frame.task
    frame.task = frame.owner = None  # the frame is reused: let go of the record
    if own_total is None:
        own_total = _tls.stack[0].own
    own = own_total - frame.own if frame.mode == CPU else 0
    close_frame(frame, t1, False, owner.link, own)
    closed[task] = (t1, own_total)


def close_ended(stack: List[Frame]) -> None:
    """Before a counted call's backward is counted (its anchor's output node runs): close
    this pass's backward frames on top of ``stack``, as ended now. Anchors never nest, so a
    step still open there is one whose backward autograd ran in part."""
    task = _task_id()
    t1 = clock.cpu_now()
    while stack[-1].task is not None and stack[-1].task == task:
        close_backward(stack.pop(), t1)
