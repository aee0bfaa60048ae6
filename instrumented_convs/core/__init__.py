"""The core: what every step needs, knowing nothing above it.

- :mod:`.settings` (the switches, one object) and :mod:`.configure` (``configure()``, the one
  way to change them); :mod:`.clock` (the CPU clock; CUDA events, pooled, resolved lazily);
  :mod:`.labels` (NVTX ranges and profiler labels);
- one lifecycle for forward and backward steps: :mod:`.stack` (each thread's stack of
  :class:`~.stack.Frame`), :mod:`.lifecycle` (opening and closing a frame), :mod:`.step`
  (``step()``, ``region()``, ``mark_outputs()``), the backward machinery (:mod:`.anchor`:
  the autograd nodes a step created; :mod:`.sampling`: which calls' backward is timed;
  :mod:`.backward`: the hooks that time it);
- storage: :mod:`.entry` (one step path's statistics, and :class:`~.entry.EntryStats`, the
  plain data of a snapshot), :mod:`.registry` (the tree of entries), :mod:`.timeline` (when
  each call ran); the counters (:mod:`.counters`, :mod:`.formulas`: FLOPs, bytes, memory);
- :mod:`.dynamo`: whether ``torch.compile`` is tracing; :mod:`.cycle`: the duty cycle
  (which training iterations are recorded, and the strata of the registry they are
  recorded in), :mod:`.budget`: the K a budget allows;
- :mod:`.native`: the C fast path of steps, each C part beside the Python twin it mirrors.

The layers (:mod:`instrumented_convs.layers`, ``pyg``, ``dgl``) use these modules directly.
The commands and integrations use the face and the report, and from the core only what this
package itself offers (:data:`__all__`, imported when first read):

- ``IMPLEMENTATION``: ``"C"`` or ``"Python"``, the fast path in use;
- ``nvtx_tool_attached()``: whether an NVTX tool (Nsight Systems) can see ranges;
- ``timeline_recording()``: whether the timeline records; ``noted(key, signature)`` and
  ``note(key, inputs, signature, keep)``: what a call was given, for the timeline;
- ``duty_cycle()``: what the duty cycle says of itself, for a summary (None while it never
  drew an iteration);
- ``compiling()``: whether Dynamo is tracing the caller (``torch.compile``), asked first by
  every hook; ``inside_compiled()``: whether eager code runs inside a compiled call (after
  a graph break); ``skip_frame(fn)``: Dynamo compiles what ``fn`` calls, never ``fn``'s frame;
  ``run_eagerly(fn)``: Dynamo leaves ``fn`` and all it calls alone; ``compiled()``: what
  ran compiled, for a summary (None: nothing); ``owner``: ``owner.name`` names the compiled
  call under way on this thread (its step), for what Dynamo traces during it;
  ``listed(name, layers)``: a compiled model's conv layers, from its module tree;
  ``watch_compiles()``: from now on, graph breaks in frames Dynamo compiles on their own are
  attributed to the conv layer running under them.
"""

from typing import Any

__all__ = [
    "IMPLEMENTATION",
    "nvtx_tool_attached",
    "timeline_recording",
    "noted",
    "note",
    "duty_cycle",
    "compiling",
    "inside_compiled",
    "skip_frame",
    "run_eagerly",
    "compiled",
    "owner",
    "listed",
    "watch_compiles",
]


#: The names read from ``dynamo`` (``compiled`` is its ``describe``).
_FROM_DYNAMO = frozenset(__all__[__all__.index("compiling") : __all__.index("listed") + 1])


def __getattr__(name: str) -> Any:
    """The names of :data:`__all__`, from the modules that hold them (imported, and bound
    here, at the first read)."""
    if name == "IMPLEMENTATION":
        from .native import IMPLEMENTATION as value
    elif name == "nvtx_tool_attached":
        from .labels.nvtx import tool_attached as value
    elif name == "timeline_recording":
        from .storage.timeline import recording as value
    elif name == "duty_cycle":
        from .dutycycle.cycle import cycle

        value = cycle.describe
    elif name in _FROM_DYNAMO:
        from .compiler import dynamo

        value = getattr(dynamo, "describe" if name == "compiled" else name)
    elif name == "watch_compiles":
        from .compiler.breaks import watch as value
    elif name in ("noted", "note"):
        from .storage import timeline

        value = getattr(timeline, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
