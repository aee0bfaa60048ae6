"""The core: what every step needs, one job per folder (switches, clocks, frames, steps,
backward timing, storage, meters, the duty cycle, the compiler's view, labels, the C fast
path), knowing nothing above it.

The layers use its modules directly; the commands and integrations use only what this
package offers (:data:`__all__`, each name imported at its first read).
"""

from typing import Any

__all__ = [
    "IMPLEMENTATION",
    "nvtx_tool_attached",
    "timeline_recording",
    "noted",
    "note",
    "duty_cycle",
    "on_demand",
    "Busy",
    "compiling",
    "inside_compiled",
    "skip_frame",
    "run_eagerly",
    "compiled",
    "owner",
    "listed",
    "watch_compiles",
    "setup",
    "tool_time",
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
    elif name == "on_demand":  # the captures asked for (record="on-demand")
        from .dutycycle.cycle import cycle

        value = cycle.demand
    elif name == "Busy":
        from .dutycycle.demand import Busy as value
    elif name in _FROM_DYNAMO:
        from .compiler import dynamo

        value = getattr(dynamo, "describe" if name == "compiled" else name)
    elif name == "watch_compiles":
        from .compiler.breaks import watch as value
    elif name in ("setup", "tool_time"):  # the tool's one-time work, out of the user's rows
        from .frames import setup

        value = getattr(setup, name)
    elif name in ("noted", "note"):
        from .storage import timeline

        value = getattr(timeline, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
