"""``configure()``: the one way to change the switches, and :class:`Settings`, what it returns.

It sets :data:`.settings.switches` and starts or stops what a switch stands for (an NVTX
backend, the timeline, counters and memory, the duty cycle, the eager breakdown of compiled
models). The :class:`Settings` it returns are the switches as they were, and a context
manager that puts them back.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, NamedTuple, Optional, Union

from .compiler.eager import eager
from .dutycycle.cycle import cycle
from .labels.nvtx import mark_settings, use_nvtx
from .meters import counters, memory, signals
from .settings import RECORD_REQUEST, nvtx_choice, record_mode, switches
from .storage import timeline

__all__ = ["Settings", "configure"]

logger = logging.getLogger(__name__)


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
    record_every: int = 1  #: the duty cycle records one iteration in this many (1: all)
    budget: Optional[float] = None  #: the duty cycle chooses ``record_every`` under it
    iteration: Optional[str] = None  #: the region that is an iteration (None: optimizer steps)
    compiled: str = "compiled"  #: ``eager``: recorded iterations run compiled code eagerly
    memory: bool = False  #: steps record what they keep for backward, and their peaks
    #: ``ranges``: steps push NVTX ranges and record nothing; ``on-demand``: nothing until
    #: a capture asks
    record: str = "all"
    #: where captures go (None: where the process listened last, else a new
    #: ``ic-runs/<script>-<time>`` under the current folder)
    captures: Optional[str] = None
    advise: bool = False  #: layers note what the advice's rules read

    def restore(self) -> None:
        """Set every switch back to the value it has in this snapshot."""
        s = switches
        s.nvtx = use_nvtx(self.nvtx)
        s.wanted, s.record_function, s.statements = (
            self.enabled,
            self.record_function,
            self.statements,
        )
        if (self.record == "ranges") != s.ranges:  # (staying in it: the value to put back stays)
            s.ranges, s.every_before_ranges = self.record == "ranges", None
        s.apply()
        cycle.demand.folder = self.captures
        if self.record == "on-demand":
            _demand(True, self.iteration)
        else:
            _demand(False, self.iteration)
            _cycle(self.record_every, self.budget, self.iteration)
        eager.set(self.compiled == "eager", cycle.now)
        s.backward, s.backward_every = self.backward, self.backward_every
        s.every_before_counters = None
        _timeline(self.timeline)
        _counters(self.counters)
        _memory(self.memory)
        _advise(self.advise)
        _mark()

    @staticmethod
    def check(**switches: Any) -> None:
        """Raise as :func:`configure` would for these switches, changing nothing."""
        unknown = sorted(set(switches) - set(Settings._fields))
        if unknown:
            raise TypeError(f"unknown switches {unknown}; configure takes {Settings._fields}")
        _check(switches)

    def __enter__(self) -> "Settings":
        """The block runs with the switches :func:`configure` set; this is what they were."""
        return self

    def __exit__(self, *exc: Any) -> None:
        """Put these switches back (exceptions propagate)."""
        self.restore()


#: The switches that take ``True`` or ``False`` (a bool: ``1`` and ``"false"`` are refused).
_BOOLS = ("enabled", "record_function", "backward", "counters", "statements", "memory", "advise")
#: The switches that take a whole number (an int, not a bool or a float).
_WHOLE = ("backward_every", "timeline", "record_every")


def _typed(name: str, value: Any) -> None:
    """Raise ``TypeError`` unless ``value`` is of the type switch ``name`` takes."""
    if value is None or name == "nvtx":  # (nvtx_choice says what nvtx takes)
        return
    if name in _BOOLS:
        ok, wanted = isinstance(value, bool), "True or False (a bool)"
    elif name in _WHOLE:
        ok = isinstance(value, int) and not isinstance(value, bool)
        wanted = "a whole number (an int)"
    elif name == "budget":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        wanted = "a fraction (a float; 0.01 is 1%)"
    elif name == "captures":
        ok, wanted = isinstance(value, (str, os.PathLike)), "a folder (a str or a path)"
    else:  # iteration, compiled, record
        ok, wanted = isinstance(value, str), "a string"
    if not ok:
        raise TypeError(f"{name} takes {wanted}, not {type(value).__name__} {value!r}")


def _check(asked: Dict[str, Any]) -> None:
    """Raise as :func:`configure` does for the switches ``asked``: ``TypeError`` for a value
    of the wrong type, ``ValueError`` for one out of range."""
    for name, value in asked.items():
        _typed(name, value)
    record_every, budget = asked.get("record_every"), asked.get("budget")
    if record_every is not None and record_every < 1:
        raise ValueError(f"record_every must be a whole number >= 1, not {record_every!r}")
    if budget is not None:
        if record_every is not None:
            raise ValueError(
                "record_every and budget both choose how often iterations are recorded: "
                "give one of them"
            )
        if not 0 < budget < 1:
            raise ValueError(f"budget must be a fraction in (0, 1) (0.01: 1%), not {budget!r}")
    iteration = asked.get("iteration")
    if iteration is not None and (not iteration or "/" in iteration):
        raise ValueError(
            f"iteration names a region: a non-empty string without '/', not {iteration!r}"
        )
    compiled = asked.get("compiled")
    if compiled is not None and compiled not in ("compiled", "eager"):
        raise ValueError(f"compiled must be 'compiled' or 'eager', not {compiled!r}")
    every = asked.get("backward_every")
    if every is not None and every < 1:
        raise ValueError(f"backward_every must be a whole number >= 1, not {every!r}")
    timeline = asked.get("timeline")
    if timeline is not None and timeline < 0:
        raise ValueError(f"timeline must be a whole number >= 0, not {timeline!r}")
    if asked.get("nvtx") is not None:
        nvtx_choice(asked["nvtx"])
    if asked.get("record") is not None:
        record_mode(asked["record"])
    drawn = (record_every or 1) > 1 or budget is not None
    if asked.get("record") == "on-demand" and drawn:
        raise ValueError(
            "record='on-demand' records every iteration a capture asks for: not with "
            "record_every or budget"
        )


def _current() -> Settings:
    s = switches
    return Settings(
        s.wanted,
        s.nvtx,
        s.record_function,
        s.backward,
        s.backward_every,
        s.timeline,
        s.counters,
        s.statements,
        cycle.every if cycle.budget is None else 1,
        cycle.budget,
        cycle.iteration,
        "eager" if eager.asked else "compiled",
        s.memory,
        "ranges" if s.ranges else "on-demand" if cycle.demand.on else "all",
        cycle.demand.folder,
        s.advise,
    )


def _mark() -> None:
    """Say in the NVTX stream what shapes the ranges (report.nsys reads it back)."""
    s = switches
    mark_settings(
        record="ranges" if s.ranges else "on-demand" if cycle.demand.on else "all",
        enabled=s.wanted,
        backward=s.backward,
        backward_every=s.backward_every,
        record_every=cycle.every if cycle.budget is None else "budget",
        rank=os.environ.get("RANK", "none"),  # torchrun's: the report's processes in order
    )


def _one_every(other_on: bool, other_saved: Optional[int]) -> Optional[int]:
    """A mode that times every call's backward (the counters, the ranges) starts: the value
    to put back when it stops (None where the other such mode, on, holds it already)."""
    s = switches
    if other_on and other_saved is not None:
        return None
    saved, s.backward_every = s.backward_every, 1
    return saved


def _put_back(other_on: bool, saved: int) -> Optional[int]:
    """Such a mode stops: ``backward_every`` back to ``saved``, unless the other is on (it
    keeps 1, and ``saved`` is the other's to put back: returned)."""
    if other_on:
        return saved
    switches.backward_every = saved
    return None


def _record(mode: str, every_given: bool, iteration: Optional[str]) -> None:
    """Enter or leave the ranges mode (every call's backward has ranges in it: its
    ``backward_every`` put back after, unless one was given meanwhile) and on demand."""
    _ranges(mode == "ranges", every_given)
    _demand(mode == "on-demand", iteration)


def _demand(on: bool, iteration: Optional[str]) -> None:
    """Turn on demand on (the cycle records what captures ask for, and nothing else; a
    listener takes their requests) or off (a capture under way is handed over as it is)."""
    d = cycle.demand
    if on:
        if not d.on or cycle.iteration != iteration:
            cycle.start(iteration=iteration, demand=True)
        d.serve()
    elif d.on:
        d.unserve()
        cycle.stop()
        cycle.iteration = iteration


def _ranges(on: bool, every_given: bool) -> None:
    s = switches
    if on == s.ranges:
        return
    s.ranges = on
    if s.ranges and not every_given:
        s.every_before_ranges = _one_every(s.counters, s.every_before_counters)
    elif not s.ranges and s.every_before_ranges is not None and not every_given:
        s.every_before_counters = _put_back(s.counters, s.every_before_ranges)
    if not s.ranges:
        s.every_before_ranges = None
    s.apply()
    if s.ranges and s.nvtx == "none":
        logger.warning(
            "record='ranges' pushes NVTX ranges and records nothing, and no NVTX tool is "
            "attached (nsys profile ...): steps do nothing now"
        )


def _cycle(every: int, budget: Optional[float], iteration: Optional[str]) -> None:
    """Start (or stop) the duty cycle unless it already runs so (then its draw goes on)."""
    if budget is not None:
        same = (budget, iteration) == (cycle.budget, cycle.iteration)
    else:
        same = cycle.budget is None and (every, iteration) == (cycle.every, cycle.iteration)
    if same:
        return
    if every <= 1 and budget is None:
        cycle.stop()
        cycle.iteration = iteration
    else:
        cycle.start(every, budget, iteration)


def _timeline(limit: int) -> None:
    timeline.set_limit(limit)
    memory.set_samples(limit)
    switches.timeline = limit


def _counters(on: bool) -> None:
    counters.set_on(on)
    switches.counters = on


def _memory(on: bool) -> None:
    if on:
        memory.set_on(True)
        counters.watch(memory.watcher)
    else:
        memory.set_on(False)  # on the thread that turned it on, or it raises here
        counters.watch(None)
    switches.memory = on


def _advise(on: bool) -> None:
    signals.set_on(on)
    switches.advise = on


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
    record_every: Optional[int] = None,
    budget: Optional[float] = None,
    iteration: Optional[str] = None,
    compiled: Optional[str] = None,
    memory: Optional[bool] = None,
    record: Optional[str] = None,
    captures: Union[str, "os.PathLike[str]", None] = None,
    advise: Optional[bool] = None,
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
      (its time and memory: docs/performance.md).
    - ``counters=True``: also count, per step call, the FLOPs and bytes read and written of
      the ops it runs, and the bytes of the tensors they allocate (a ``TorchDispatchMode``
      on this thread and autograd's, a ``TorchFunctionMode`` for torch-sparse's and
      torch-scatter's ops; on CUDA also the allocator's bytes left and peak; a debugging
      mode: docs/performance.md says what it costs), for the table's roofline columns
      (``summary.table(counters=True)``). It times every backward call while on
      (``backward_every=1``, unless given), so that each op lands in its own step, and
      puts the previous ``backward_every`` back when they are turned off (unless one was
      given meanwhile).

    - ``memory=True``: also record, per step, the bytes of the tensors it made that
      autograd keeps for backward (``Row.saved_bytes``: a ``saved_tensors_hooks`` pair and
      the counters' dispatch mode, on this thread and autograd's), and the most bytes alive
      above a call's start (``Row.peak_bytes``: on the CPU the tensors the dispatcher saw
      made in steps, on CUDA the allocator's count), for the table's memory columns
      (``summary.table(memory=True)``). A debugging mode (docs/memory.md says what it sees,
      what it cannot, and what it costs). Saved-tensor hooks set before it are called by
      ours; those set after it (``save_on_cpu``, checkpointing) hide what is saved under
      them (``Row.saved_aside`` counts those calls).

    - ``statements=False``: a generic layer's own statements (``alpha_src = ...``) and the
      functions its forward calls (``add_self_loops``, ``F.dropout``) are not steps; their
      time stays in the layer's own (default ``True``: docs/layers.md, docs/performance.md).

    - ``record_every=K``: the duty cycle (docs/cycle.md): record one training iteration in
      K, drawn at random (the first few always), and run the stock code in the others; the
      summary scales counts and totals to the whole run (rows marked ``~``, with their
      standard error). An iteration ends when an optimizer step ends (several optimizers
      stepped together, gradient accumulation and closures are one iteration), or is a
      call of the region ``iteration`` names. Everything outside iterations (before the
      first step; outside named iterations) is recorded in full. ``1`` turns it off.
    - ``budget=B`` (a fraction, ``0.01``): the duty cycle chooses K as it goes, from what a
      recorded iteration costs against an unrecorded one, to keep the added time under B
      (the summary says what it chose and why); not with ``record_every``.
    - ``iteration="name"``: the region (``region("name")``, outermost calls) that is an
      iteration of the duty cycle, instead of optimizer steps.
    - ``compiled="eager"``: the eager breakdown of ``torch.compile``'d models
      (docs/compiled.md). Steps are not recorded inside compiled code; with this the duty
      cycle's recorded iterations run it eagerly (``torch.compiler.set_stance
      ("force_eager")``, torch 2.6+; elsewhere a warning, and nothing changes) and give the
      steps, the others run compiled, and the summary puts an eager iteration's time
      beside a compiled one's. Without a duty cycle it starts one at ``record_every=10``.
      ``"compiled"`` (the default) turns it off.

    - ``record="ranges"``: steps push their NVTX ranges, every call's backward included
      (``backward_every=1`` unless given), and record nothing else: the least cost under
      Nsight Systems, whose report ``view`` reads back as the table, with device times
      (docs/nsys.md). With no NVTX tool attached steps then do nothing. ``"all"`` (the
      default) records times; ``INSTRUMENTED_CONVS_RECORD=ranges`` starts so.
    - ``record="on-demand"``: the layers stay instrumented and nothing is recorded (the
      stock code runs, as in a duty cycle's unrecorded iterations) until ``instrumented_convs
      capture`` asks the process for its next N iterations; those are recorded exactly and
      written as a run folder of their own in ``captures`` (default: a folder
      ``ic-runs/<script>-<time>`` made when it starts listening, as ``run``'s), and
      recording stops again (docs/run.md). Iterations are delimited as for the duty cycle
      (``iteration=``); not with ``record_every`` or ``budget``.
      ``INSTRUMENTED_CONVS_RECORD=on-demand`` starts so (listening from the first
      iteration's end), ``INSTRUMENTED_CONVS_CAPTURES=DIR`` names the folder.
    - ``captures=DIR``: where on demand writes its captures (read when it starts listening).
    - ``advise=True``: the layers note what the advice's rules read (whether each saw the
      same graph at every call, its last graph); :func:`instrumented_convs.advise` then
      says what to change (docs/advice.md).

    Used as ``with configure(...):``, the switches are put back when the block ends.
    A value of the wrong type (``enabled="false"``, ``record_every=2.5``; ``1`` is no
    ``True``) raises ``TypeError``, one out of range ``ValueError``, and nothing changes.
    """
    asked = dict(locals())  # the arguments (no other name is bound yet)
    _check(asked)
    demanded = record == "on-demand" or (record is None and cycle.demand.on)
    if demanded and ((record_every or 1) > 1 or budget is not None):
        raise ValueError(
            "on demand (record='on-demand') a capture records every iteration it covers: "
            "configure(record='all') first for record_every or budget"
        )
    s = switches
    choice = None if nvtx is None else nvtx_choice(nvtx)
    previous = _current()
    if choice is not None:
        s.nvtx = use_nvtx(choice)
        s.apply()
    if enabled is not None:
        s.wanted = enabled
        s.apply()
    if record_function is not None:
        s.record_function = record_function
    if backward is not None:
        s.backward = backward
    if backward_every is not None:
        s.backward_every = backward_every
    if statements is not None:
        s.statements = statements
    if timeline is not None and timeline != s.timeline:
        _timeline(timeline)
    if backward_every is not None:  # the user's value: kept when the counters or ranges stop
        s.every_before_counters = s.every_before_ranges = None
    if counters is not None and bool(counters) != s.counters:
        if counters and backward_every is None:
            s.every_before_counters = _one_every(s.ranges, s.every_before_ranges)
        elif not counters and s.every_before_counters is not None:
            s.every_before_ranges = _put_back(s.ranges, s.every_before_counters)
            s.every_before_counters = None
        _counters(bool(counters))
    if memory is not None and bool(memory) != s.memory:
        _memory(bool(memory))
    if captures is not None:
        cycle.demand.folder = os.fspath(captures)
    if advise is not None:
        _advise(bool(advise))
    if record is not None and record != "on-demand":  # off first: a cycle below finds it so
        _demand(False, iteration or cycle.iteration)
    drawing = record_every is not None or budget is not None or iteration is not None
    if drawing and not demanded:  # (on demand, the iteration is its own: below)
        every = previous.record_every if record_every is None else record_every
        if budget is None and record_every is None:
            budget = previous.budget
        _cycle(every if budget is None else 1, budget, iteration or previous.iteration)
    if record is not None or (demanded and iteration is not None):
        _record(record or "on-demand", backward_every is not None, iteration or cycle.iteration)
    if compiled is not None:
        if compiled == "eager" and not cycle.on:
            _cycle(10, None, cycle.iteration)  # the eager breakdown needs undrawn iterations
        eager.set(compiled == "eager", cycle.now)
    _mark()
    return previous


if RECORD_REQUEST == "on-demand":  # (listening from the first iteration's end)
    cycle.start(demand=True)
_mark()  # the switches at import, for a report read back
