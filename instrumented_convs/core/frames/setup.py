"""The tool's own one-time work at a first call, kept out of the user's rows.

Some of what the tool does happens once, inside the user's loop: ``run`` instruments a model
at its first call, and a layer class's forward is rewritten with its statements' steps at
its first instrumented call. That time is the tool's, not the model's: :func:`setup` runs
it aside. Every step and region open on the thread leaves it out (a CUDA frame's host time
does; its device time is the device's), loaders leave it out of their passes
(:func:`tool_time`), and it is recorded as one top-level row of its own, :data:`SETUP`, of
kind ``tool``, which the summary keeps out of its fractions' total (an NVTX range of its
own under a tool, which a report read back lifts to that row).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterator

from ..clocks import cpu as clock
from ..labels import nvtx
from ..settings import switches
from ..storage import registry as registry_module
from ..storage import timeline
from .stack import ASIDE, CPU, CUDA, thread_stack

__all__ = ["SETUP", "TOOL", "setup", "tool_time", "aside_of"]

SETUP = "instrumented_convs (setup)"  #: the row of the tool's one-time work
TOOL = "tool"  #: its kind

_lock = threading.Lock()
_total = [0]  # ns of the tool's one-time work, every thread
_depth = threading.local()
#: id of an open region frame -> ns of the tool's work inside it (the frame's ASIDE flag is
#: set, so its close takes the general path, which reads this)
_debts: Dict[int, int] = {}


def tool_time() -> int:
    """ns of the tool's one-time work so far, every thread (a loader's pass leaves out what
    was done during it)."""
    return _total[0]


def aside_of(frame: object) -> int:
    """The ns of the tool's work to leave out of the region ``frame`` closing now (and
    forget)."""
    return _debts.pop(id(frame), 0)


@contextlib.contextmanager
def setup() -> Iterator[None]:
    """Run the block as the tool's one-time work (see the module's docstring); nested, the
    outermost counts."""
    if getattr(_depth, "n", 0):
        yield
        return
    _depth.n = 1
    pushed = nvtx.live and nvtx.backend.push_tool(SETUP)  # (a row of its own read back)
    t0 = clock.cpu_now()
    try:
        yield
    finally:
        t1 = clock.cpu_now()
        _depth.n = 0
        if pushed:  # its time as recorded: the range holds its first push's work too
            nvtx.timed(t1 - t0)
            nvtx.pop()
        _aside(t0, t1)


def _aside(t0: int, t1: int) -> None:
    ns = t1 - t0
    with _lock:
        _total[0] += ns
    stack = thread_stack()
    stack[0].own += ns  # out of every step open here (see Frame.own)
    for frame in stack[1:]:
        owner = frame.owner
        if frame.mode in (CPU, CUDA) and getattr(owner, "region", False):
            before = _debts.get(id(frame), 0) if frame.flags & ASIDE else 0
            frame.flags |= ASIDE  # (regions keep the tool's per-call time: not this)
            _debts[id(frame)] = before + ns
    if not switches.enabled or switches.ranges:  # (the ranges mode records nothing itself)
        return
    registry = registry_module.registry
    root = registry.root
    entry = root.children.get(SETUP)
    if entry is None:
        entry = registry.child(root, SETUP, None, TOOL, "forward")
    registry.record(entry, ns)
    if timeline.events is not None:
        timeline.add(entry, t0, t1, -1)
