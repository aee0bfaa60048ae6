"""instrumented_convs: where the time goes inside graph convolution layers.

Change one import (``from instrumented_convs.pyg import GCNConv``), train as before, then
``print(registry.summary())``: every internal step of every layer, timed (CUDA events on a
GPU, no per-step synchronize), nested, and shown as NVTX ranges and profiler labels. This
module holds every name a user calls (``__all__``).
"""

import typing as _t

# First: a torch too old is named in one line, not met as a failure in another import.
from .core.native import versions as _versions  # noqa: F401

# isort: split
from .core.compiler import dynamo as _dynamo
from .core.configure import Settings, configure
from .core.dutycycle.cycle import cycle as _cycle
from .core.meters import memory as _memory
from .core.meters import readings as _readings
from .core.steps.step import region
from .core.storage import timeline as _timeline
from .core.storage.entry import EntryStats as _EntryStats
from .core.storage.registry import registry as _store
from .layers.contract import name_layers
from .layers.instrument import instrument, uninstrument
from .report.stats import summarize as _summarize
from .report.summary import Summary as _Summary
from .report.timeline import Timeline as _Timeline

__version__ = "0.1.0"

__all__ = [
    "region",
    "instrument",
    "uninstrument",
    "name_layers",
    "registry",
    "configure",
    "Settings",
    "advise",
]


class _Registry:
    """Where every step records (one per process): the core's storage, read through the
    report. Everything but :meth:`summary` and :meth:`timeline` is the storage's own."""

    __slots__ = ()

    def summary(
        self,
        by: str = "step",
        unit: _t.Optional[str] = None,
        all_ranks: bool = False,
        group: _t.Any = None,
    ) -> _Summary:
        """A :class:`~instrumented_convs.report.Summary` of everything recorded so far.

        ``by="step"`` merges each step path across layer instances (scopes);
        ``by="layer"`` gives one row per (layer instance, step path); ``by="relation"``
        one per (relation of a heterogeneous model, step path). ``unit`` forces the
        table's time unit (``s``, ``ms``, ``us``, ``ns``).

        ``all_ranks=True`` merges the registries of every rank of a torch.distributed job: a
        collective over ``group`` (default: the default process group) that every rank must
        call, returning on every rank the merged summary, with the spread across ranks per
        step and ``by_rank()`` (see :mod:`instrumented_convs.distributed`). Without an
        initialised process group it raises RuntimeError.
        """
        sampling = _cycle.describe()  # before the snapshot: it settles the weights
        compiled = _dynamo.describe()
        if all_ranks:
            from .distributed import merged_summary

            stats = _readings.snapshot()
            return merged_summary(
                stats, by=by, unit=unit, group=group, sampling=sampling, compiled=compiled
            )
        return _summarize(
            _readings.snapshot(), by=by, unit=unit, sampling=sampling, compiled=compiled
        )

    def timeline(self) -> _Timeline:
        """The :class:`~instrumented_convs.report.Timeline` of the calls recorded while
        ``configure(timeline=N)`` was on (pending CUDA times resolved first)."""
        _store.resolve()
        return _Timeline(dict(_timeline.snapshot(), memory=_memory.samples()))

    def reset(self) -> None:
        """Forget every recorded time (the timeline too) and start a new tree.

        Steps open during the reset are recorded, whole, into the new tree when they close,
        and steps opened inside them later nest under them there as usual. The duty cycle
        numbers iterations from 0 again: the first ones are recorded in full again.
        """
        _readings.reset()
        _cycle.restart()

    def snapshot(self) -> _t.List[_EntryStats]:
        """Every entry as plain data, depth first (after resolving pending CUDA times): an
        :class:`~instrumented_convs.core.storage.entry.EntryStats` each (raw statistics, integer ns,
        its counters, the index of its parent record, -1 at the top level, and the weight
        of a sampled run's entries), all a summary is made of."""
        _cycle.describe()  # settles whether the recorded iteration under way counts yet
        return _readings.snapshot()

    def __getattr__(self, name: str) -> _t.Any:
        """The storage's other attributes (``pending``, ``entries()``...: for tests and tools)."""
        return getattr(_store, name)

    def __repr__(self) -> str:
        """``<instrumented_convs.registry: N entries>``."""
        return f"<instrumented_convs.registry: {len(_store.entries())} entries>"


#: Where every step records (one per process): ``summary()`` reads it, ``reset()`` empties it.
registry = _Registry()


def advise(
    min_share: float = 0.05, seconds: _t.Optional[float] = None, compile: bool = False
) -> _t.List[_t.Dict[str, _t.Any]]:
    """What to change, the largest time at stake first (docs/advice.md): the rules read what
    was recorded (by layer), the layers' signals (``configure(advise=True)`` before training)
    and the loaders given to ``instrument_loader``; where advising, the changes that replace
    work are first timed on the layers' own last inputs, in ``seconds`` at most (default: a
    tenth of the recorded time, 60 s at most; 0: none; ``compile``: each layer compiled too).
    Each item says its ``rule``, ``layers``, ``change``, ``why``, ``valid_when``,
    ``at_stake_share`` (an upper bound), ``measured_saving_share`` (where timed) and
    ``outputs``; items under ``min_share`` of the recorded time are left out."""
    from .core.meters import signals
    from .report.rules import Record, decide
    from .workers import loaders_result

    summary = registry.summary(by="layer")
    if configure().advise and seconds != 0:
        from .layers.trials import measure

        measure(seconds if seconds is not None else min(60.0, 0.1 * summary.total), compile)
    record = Record(summary, signals.describe(), loaders_result())
    return decide(record, min_share)


def _listen(on: bool) -> None:
    """Start (``on``) or stop listening for captures: what the core's on demand calls (the
    listener and the captures' writer are the commands', above the core)."""
    from .commands.launch.ondemand import switch

    switch(on)


_cycle.demand.register(_listen)


def load_ipython_extension(ipython: _t.Any) -> None:
    """``%load_ext instrumented_convs`` in IPython or Jupyter: the ``%%instrumented`` cell
    magic (:mod:`instrumented_convs.notebook`)."""
    from .notebook import load_ipython_extension as load

    load(ipython)
