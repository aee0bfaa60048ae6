"""One lifecycle for every timed frame: forward steps and backward steps alike.

:func:`open_frame` starts a frame: an NVTX range (if a tool can see it), a profiler label
(only while a torch profiler records), then the clock, last, so the bookkeeping stays
outside the measured time. :func:`close_frame` undoes it in the reverse order: the clock
first (the caller reads the CPU clock before anything else; a CUDA frame records its end
event here), then the label, then the range, and records the duration. Forward steps
(:mod:`.step`) and backward steps (:mod:`.backward`) both go through these two functions,
so there is one hot path to keep fast and one place to change.

NVTX: with no NVTX tool attached, every NVTX call is a no-op in C that still costs a Python
call per push and per pop. Tools (Nsight Systems, Nsight Compute) attach when the process
starts, through the environment variable ``NVTX_INJECTION64_PATH``; without it nothing can
ever receive a range, so the default backend is then ``none`` and ranges cost nothing.
``configure(nvtx="nvtx")`` picks a backend explicitly (it pushes ranges even with no tool
in sight); :func:`use_nvtx` is how :func:`~instrumented_convs.configure` switches.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..clocks import cpu as clock
from ..clocks import events
from ..labels import nvtx, profiler
from ..settings import switches
from ..storage import timeline
from ..storage.registry import registry
from .stack import CPU, CUDA, LABELLED, PUSHED, SAMPLED, UNTIMED, Frame

__all__ = [
    "open_frame",
    "close_frame",
    "close_elsewhere",
    "abandon_frame",
]

_open_rf = profiler.open_record_function
_prof = profiler.profiler_state
_record = registry.record  # the registry's narrow write API, bound once
_record_sampled = registry.record_sampled
_record_pending = registry.record_pending
_record_untimed = registry.record_untimed
_record_event = events.record_event


def open_frame(frame: Frame, label: str, cuda: bool, dev: Optional[int]) -> None:
    """Start ``frame``: NVTX range and profiler label named ``label``, then the clock.

    ``cuda``: time with a CUDA event pair on the current stream of device ``dev`` (None:
    the current device), else with the CPU clock. If opening the label fails, the range is
    popped again and the exception propagates (the frame is then not open).
    """
    flags = 0
    if nvtx.live:
        nvtx.push(label)
        flags = PUSHED
    if switches.record_function and _prof._is_profiler_enabled:
        try:
            frame.rf = _open_rf(label)
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
    start = None
    if not torch.cuda.is_current_stream_capturing():  # read at call time: tests replace it
        try:
            slot = None
            if timeline.events is not None:  # the CPU start too, and the device's reference
                frame.cpu0 = clock.cpu_now()
                slot = timeline.gpu_ref(torch.cuda.current_device() if dev is None else dev)
            frame.gpu = slot
            start = _record_event(dev)
        except RuntimeError:  # e.g. a pending device error: time nothing, fail nothing
            start = None
    frame.mode = UNTIMED if start is None else CUDA
    frame.start = start


def close_frame(frame: Frame, t1: int, error: bool, link: Any = None, own: int = 0) -> None:
    """Stop ``frame``'s clock, close its label and range, and record its time.

    ``t1`` is the CPU clock, read by the caller before anything else. ``error``: the frame
    ended with an exception (counted; the time is recorded all the same). ``link``: what
    pairs the call with its forward on the timeline (a backward's; a forward's is its
    ``seq0``). ``own``: ns of the tool's own code that ran inside the frame (a CPU frame's
    time leaves them out; the timeline shows the frame where it ran). The frame may be
    reused as soon as this returns: it lets go of its profiler handle.
    """
    mode = frame.mode
    end = None
    if mode == CUDA:
        try:
            end = _record_event(frame.dev)  # the clock first
        except RuntimeError:
            mode = UNTIMED
    flags = frame.flags
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
            end = _record_event(None)
        except RuntimeError:
            mode = UNTIMED
    _record_frame(frame, mode, t1, end, False, link)


def _record_frame(
    frame: Frame, mode: int, t1: int, end: Any, error: bool, link: Any, own: int = 0
) -> None:
    """Record a closed frame's time in the registry, and on the timeline when it records."""
    sampled = bool(frame.flags & SAMPLED)
    if mode == CPU:
        if sampled:
            _record_sampled(frame.entry, t1 - frame.start - own)
        else:
            _record(frame.entry, t1 - frame.start - own, error)
        if timeline.events is not None:
            timeline.add(frame.entry, frame.start, t1, link)
    elif mode == CUDA:
        slot, frame.gpu = frame.gpu, None  # see open_frame
        _record_pending(frame.entry, frame.start, end, error, sampled, slot)
        if slot is not None and timeline.events is not None:
            timeline.add(frame.entry, frame.cpu0, t1, link, slot)
    else:
        _record_untimed(frame.entry, error)


def abandon_frame(frame: Frame, error: bool, count: bool = True) -> None:
    """Close ``frame``'s label and range; its end never came: count the call as untimed
    (unless ``count`` is False: another frame already counts it)."""
    try:
        _close_label_and_range(frame, frame.flags)
    finally:
        if count:
            _record_untimed(frame.entry, error)


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
