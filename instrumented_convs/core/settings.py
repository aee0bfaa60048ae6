"""Process-wide switches: recording on/off, NVTX ranges, record_function labels, backward.

Every switch is a plain module attribute so that the hot path pays one attribute read;
:func:`configure` is the one public way to change and read them. It returns the switches
as they were, a :class:`Settings` that is also a context manager putting them back::

    with configure(enabled=False):      # a block run on the stock code, nothing recorded
        model(x, edge_index)
    previous = configure(backward=False)    # or for good: previous.restore() undoes it

The environment variables are read once, at import:

- ``INSTRUMENTED_CONVS_DISABLE=1``: start disabled (every step is a no-op).
- ``INSTRUMENTED_CONVS_NVTX``: ``0``/``none`` never pushes NVTX ranges; ``nvtx`` or
  ``torch`` picks that backend; ``1``/``auto`` (default) pushes them when a tool is attached.
- ``INSTRUMENTED_CONVS_RECORD_FUNCTION=0``: never open ``torch.profiler.record_function``.
- ``INSTRUMENTED_CONVS_BACKWARD=0``: never time the backward of steps (see :mod:`._backward`).
- ``INSTRUMENTED_CONVS_BACKWARD_EVERY=N``: how often the backward of a layer call is timed
  (see :func:`configure`; ``1``: every call).
- ``INSTRUMENTED_CONVS_STATEMENTS=0``: a generic layer's own statements and the functions
  its forward calls are not steps (see :func:`configure`).

This module imports nothing from the package: it is the bottom of the house. The NVTX
backends live above it (:mod:`._frame`), which registers the function that picks one
(:func:`on_nvtx`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, NamedTuple, Optional, Union

_FALSE = ("", "0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def _env_flag(name: str, default: bool) -> bool:
    """Read a boolean environment variable (``1/true/yes/on`` or ``0/false/no/off``)."""
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in _FALSE


#: NVTX backends by name; ``auto`` is the default's request (see :func:`configure`).
NVTX_CHOICES = ("auto", "nvtx", "torch", "none")


def nvtx_choice(value: Union[bool, str]) -> str:
    """``value`` as one of :data:`NVTX_CHOICES` (``True`` is ``auto``, ``False`` ``none``)."""
    if value is True:
        return "auto"
    if value is False:
        return "none"
    if isinstance(value, str) and value in NVTX_CHOICES:
        return value
    raise ValueError(
        f"nvtx must be one of {', '.join(map(repr, NVTX_CHOICES))}, True or False, not {value!r}"
    )


def _env_nvtx(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        return "auto"
    v = value.strip().lower()
    if v in _TRUE:
        return "auto"
    if v in _FALSE:
        return "none"
    try:
        return nvtx_choice(v)
    except ValueError:
        raise ValueError(
            f"{name} must be 0, 1 or one of {', '.join(NVTX_CHOICES)}, not {value!r}"
        ) from None


enabled: bool = not _env_flag("INSTRUMENTED_CONVS_DISABLE", False)
#: What the environment asked of NVTX (``auto`` unless ``INSTRUMENTED_CONVS_NVTX`` says).
NVTX_REQUEST: str = _env_nvtx("INSTRUMENTED_CONVS_NVTX")
#: The NVTX backend in use: ``nvtx``, ``torch`` or ``none`` (set through :func:`on_nvtx`).
nvtx: str = "none"
record_function: bool = _env_flag("INSTRUMENTED_CONVS_RECORD_FUNCTION", True)
backward: bool = _env_flag("INSTRUMENTED_CONVS_BACKWARD", True)
#: The default of ``backward_every``: the first 16 calls of each layer, then one in 16.
BACKWARD_EVERY = 16


def _env_every(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        every = int(value)
    except ValueError:
        raise ValueError(f"{name} must be a whole number >= 1, not {value!r}") from None
    if every < 1:
        raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    return every


backward_every: int = _env_every("INSTRUMENTED_CONVS_BACKWARD_EVERY", BACKWARD_EVERY)
statements: bool = _env_flag("INSTRUMENTED_CONVS_STATEMENTS", True)


class Settings(NamedTuple):
    """The switches at one moment, as :func:`configure` returns them (the ones it replaced).

    A context manager: leaving a ``with`` block puts these switches back
    (``with configure(enabled=False): ...``); :meth:`restore` does the same at any time.
    """

    enabled: bool  #: steps record
    nvtx: str  #: the NVTX backend in use: ``nvtx``, ``torch`` or ``none``
    record_function: bool  #: steps open profiler labels while a profiler records
    backward: bool  #: steps time their backward too (autograd hooks)
    backward_every: int  #: how often a layer call's backward is timed
    timeline: int = 0  #: the most calls the timeline records (0: off)
    counters: bool = False  #: steps count the FLOPs and bytes of their ops
    statements: bool = True  #: a generic layer's own statements and calls are steps

    def restore(self) -> None:
        """Set every switch back to the value it has in this snapshot."""
        global enabled, record_function, backward, backward_every, _every_before_counters
        global statements
        _set_nvtx(self.nvtx)
        enabled, record_function, statements = self.enabled, self.record_function, self.statements
        backward, backward_every = self.backward, self.backward_every
        _every_before_counters = None
        _apply("timeline", self.timeline)
        _apply("counters", self.counters)

    def __enter__(self) -> "Settings":
        """The block runs with the switches :func:`configure` set; this is what they were."""
        return self

    def __exit__(self, *exc: Any) -> None:
        """Put these switches back (exceptions propagate)."""
        self.restore()


def _current() -> Settings:
    return Settings(
        enabled, nvtx, record_function, backward, backward_every, timeline, counters, statements
    )


#: The most calls the timeline records (0: off), and whether steps count the FLOPs and bytes
#: of their ops: applied by the functions registered with :func:`on_switch`.
timeline: int = 0
counters: bool = False
#: ``backward_every`` as it was before the counters set it to 1 (put back when they stop).
_every_before_counters: Optional[int] = None
_setters: Dict[str, Callable[[Any], Any]] = {}


def on_switch(name: str, setter: Callable[[Any], Any]) -> None:
    """Register the function that applies switch ``name``: ``timeline``
    (``_timeline.set_limit``) or ``counters`` (``_counters.set_on``), at their import."""
    _setters[name] = setter


def _apply(name: str, value: Any) -> None:
    setter = _setters.get(name)
    if setter is None:
        raise RuntimeError(f"nothing applies {name} (import instrumented_convs)")
    setter(value)
    globals()[name] = value


_nvtx_setter: Optional[Callable[[str], str]] = None


def on_nvtx(setter: Callable[[str], str]) -> None:
    """Register the function that switches NVTX backends: it takes a choice of
    :data:`NVTX_CHOICES` and returns the name of the backend then in use. Called once by
    :mod:`._frame` at import, which applies :data:`NVTX_REQUEST` through it."""
    global _nvtx_setter
    _nvtx_setter = setter
    _set_nvtx(NVTX_REQUEST)


def _set_nvtx(choice: str) -> None:
    global nvtx
    if _nvtx_setter is None:
        raise RuntimeError("no NVTX backends are registered (import instrumented_convs)")
    nvtx = _nvtx_setter(choice)


def configure(
    *,
    enabled: Optional[bool] = None,
    nvtx: Union[bool, str, None] = None,
    record_function: Optional[bool] = None,
    backward: Optional[bool] = None,
    backward_every: Optional[int] = None,
    timeline: Optional[int] = None,
    counters: Optional[bool] = None,
    statements: Optional[bool] = None,
) -> Settings:
    """Set switches; return the :class:`Settings` as they were (a context manager).

    ``None`` keeps a switch as it is, so ``configure()`` only reads them.

    - ``enabled``: whether steps record. Disabled, a step costs one flag check and the
      layers run the stock code (``INSTRUMENTED_CONVS_DISABLE=1`` starts disabled).
    - ``nvtx``: how steps push NVTX ranges: ``"auto"`` (or ``True``; the default) through
      the ``nvtx`` package, else ``torch.cuda.nvtx``, when an NVTX tool (Nsight Systems) is
      attached to the process, and not at all otherwise, since nothing could see them;
      ``"nvtx"`` or ``"torch"`` that backend even with no tool in sight; ``"none"`` (or
      ``False``) never. :class:`Settings` tells the backend then in use.
    - ``record_function``: whether steps open ``torch.profiler.record_function`` labels
      while a torch profiler records (only then: the check costs one attribute read).
    - ``backward``: whether steps time their backward (autograd hooks). ``False`` takes
      effect at once: forwards set up no hooks, and hooks set up before record nothing.
    - ``backward_every=N`` (default 16): the backward of the first N calls of each layer
      (of each step that sets up backward timing, per shape of its autograd graph) is
      timed, then that of one call in N, chosen at random; every other call's backward is
      counted, and its time estimated from the calls timed at random (``Row.estimated``
      says how many; the table marks such rows). Hooks on autograd nodes cost microseconds
      each, so timing every call's backward would cost more than the rest of the
      instrumentation together. ``backward_every=1`` times every call.
    - ``timeline=N``: also record when each step call starts and ends, on which thread (and
      on CUDA, the GPU's times from the same events), up to N calls; ``0`` (the default)
      stops it. ``registry.timeline()`` reads it, a Chrome trace for Perfetto. Turning it on
      starts an empty timeline; ``registry.reset()`` empties it. Each call costs a tuple
      (about 0.5 µs and 190 bytes: docs/performance.md).
    - ``counters=True``: also count, per step call, the FLOPs and bytes read and written of
      the ops it runs, and the bytes of the tensors they allocate (a ``TorchDispatchMode``
      on this thread and autograd's, a ``TorchFunctionMode`` for torch-sparse's and
      torch-scatter's ops; on CUDA also the allocator's bytes left and peak; a debugging
      mode: docs/performance.md says what it costs), for the table's roofline columns
      (``summary.table(counters=True)``). It times every backward call while on
      (``backward_every=1``, unless given), so that each op lands in its own step, and
      puts the previous ``backward_every`` back when they are turned off (unless one was
      given meanwhile).

    - ``statements=False``: a generic layer's own statements (``alpha_src = ...``) and the
      functions its forward calls (``add_self_loops``, ``F.dropout``) are not steps; their
      time stays in the layer's own (default ``True``: docs/layers.md, docs/performance.md).

    Used as ``with configure(...):``, the switches are put back when the block ends.
    """
    g = globals()  # the parameters shadow the module switches of the same names
    if backward_every is not None:
        if (
            isinstance(backward_every, bool)
            or not isinstance(backward_every, int)
            or backward_every < 1
        ):
            raise ValueError(f"backward_every must be a whole number >= 1, not {backward_every!r}")
    if timeline is not None:
        if isinstance(timeline, bool) or not isinstance(timeline, int) or timeline < 0:
            raise ValueError(f"timeline must be a whole number >= 0, not {timeline!r}")
    choice = None if nvtx is None else nvtx_choice(nvtx)
    previous = _current()
    if choice is not None:
        _set_nvtx(choice)
    if enabled is not None:
        g["enabled"] = bool(enabled)
    if record_function is not None:
        g["record_function"] = bool(record_function)
    if backward is not None:
        g["backward"] = bool(backward)
    if backward_every is not None:
        g["backward_every"] = backward_every
    if statements is not None:
        g["statements"] = bool(statements)
    if timeline is not None and timeline != g["timeline"]:
        _apply("timeline", timeline)
    if backward_every is not None:
        g["_every_before_counters"] = None  # the user's value: kept when the counters stop
    if counters is not None and bool(counters) != g["counters"]:
        if counters and backward_every is None:
            g["_every_before_counters"] = g["backward_every"]
            g["backward_every"] = 1
        elif not counters and g["_every_before_counters"] is not None:
            g["backward_every"] = g["_every_before_counters"]
            g["_every_before_counters"] = None
        _apply("counters", bool(counters))
    return previous
