"""The core: what every step needs, one job per folder (switches, clocks, frames, steps,
backward timing, storage, meters, the duty cycle, the compiler's view, labels, the C fast
path), knowing nothing above it.

The layers use its modules directly; the commands and integrations use only what this
package offers (:data:`__all__`, each name imported at its first read).
"""

from typing import Any, List, Optional, Tuple

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
    "torch_calls",
    "version_key",
    "advice_signals",
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
    elif name == "version_key":
        from .native.versions import key as value
    elif name == "torch_calls":
        value = _torch_calls
    elif name == "advice_signals":  # what the layers noted for the advice (configure(advise))
        from .meters.signals import describe as value
    elif name in ("noted", "note"):
        from .storage import timeline

        value = getattr(timeline, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _torch_calls() -> List[Tuple[str, str, Optional[str], str]]:
    """torch's private calls (:mod:`.native.private`): ``(name, what it is, verdict, what its
    fallback gives)``; the verdict is ``"in use"``, ``"fallback: why"`` or None (not used
    here). Those checked where first used (the counters', memory's) are checked now."""
    from .meters.counters import probe_extensions
    from .meters.memory import probe_hooks
    from .native import private

    probe_extensions()
    probe_hooks()
    verdicts = private.verdicts()
    return [(n, what, verdicts.get(n), instead) for n, (what, instead) in private.CALLS.items()]
