"""The common case of a step's enter and exit (:class:`StepBase`, the base of ``Step``): a
CPU-clock step with no NVTX tool, no profiler and no exception, apart so that it stays fast;
every other case goes to ``Step._enter`` / ``Step._exit``. The Python twin of the C
extension's ``StepBase`` (:data:`IMPLEMENTATION` says which runs).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import torch

from ..backward import anchor, sampling
from ..clocks import cpu as clock
from ..frames.stack import CPU, Frame, _tls
from ..labels import nvtx, profiler
from ..native import IMPLEMENTATION, seq_counter_address, speedups
from ..settings import switches
from ..storage import timeline
from ..storage.entry import FOLD_AT, Entry
from ..storage.registry import SKIPS_FOLD_AT, registry

__all__ = ["StepBase", "IMPLEMENTATION"]

# Bound once: the hot path (benchmarks/instructions.py). PyStepBase's enter and exit run for
# every CPU step in the Python twin, and each lookup through a module costs them instructions
# (through ``torch``, several times more than through ours); tests patch none of these.
_seq = anchor.seq_nr
_grad_enabled = torch.is_grad_enabled
_prof = profiler.profiler_state


class PyStepBase:
    """The fast path of Step in Python (the twin of ``_speedups.StepBase``)."""

    __slots__ = ("name", "scope", "cuda", "dev", "kind", "key", "region")

    def __enter__(self) -> Any:
        """Open the step: the common case here, every other in ``self._enter``."""
        t_in = clock.cpu_now()  # the tool's own time starts (see Frame.own)
        stack = _tls.stack
        top = stack[-1]
        parent = top.entry
        cuda = self.cuda
        # The CPU clock: a step on the CPU (device given), or inheriting it from a CPU step.
        if (
            not (cuda is False or (cuda is None and parent is not None and not top.cuda))
            or top.task is not None
        ):
            return self._enter(stack, top)  # type: ignore[attr-defined]
        if parent is None:  # top level: under the registry's root
            parent = registry.root
        if parent.retired or nvtx.live or _prof._is_profiler_enabled:
            return self._enter(stack, top)  # type: ignore[attr-defined]
        entry = parent.children.get(self.key)
        if entry is None:  # a new path: the registry creates its entry
            return self._enter(stack, top)  # type: ignore[attr-defined]
        log = top.log
        frame = top.spare  # never on the stack while ``top`` is on top: free to reuse
        if frame is None:
            frame = top.spare = Frame()
        frame.entry = entry
        frame.owner = self
        frame.cuda = False
        frame.flags = 0
        frame.mode = CPU
        if self.region:  # regions have no backward; steps inside them may
            frame.log = log
            frame.seq0 = -1
        elif log is not None:  # inside an anchor: log the node range for its walk
            frame.log = log
            frame.anchor = False
            frame.outputs = None
            frame.seq0 = _seq()
        elif switches.backward and _grad_enabled():  # the outermost step with grad: an anchor
            seq = _seq()
            frame.log, frame.anchor, frame.outputs, frame.seq0 = (
                anchor.Log(seq, len(stack)),
                True,
                None,
                seq,
            )
        else:
            frame.log = None
            frame.seq0 = -1
        stack.append(frame)
        frame.start = t0 = clock.cpu_now()  # the clock last
        bottom = stack[0]
        bottom.own += t0 - t_in
        bottom.opened += 1
        frame.own = bottom.own
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Close the step: the common case here, every other in ``self._exit``."""
        t1 = clock.cpu_now()  # the clock first
        stack = _tls.stack
        frame = stack[-1]
        if (
            frame.owner is not self
            or frame.flags
            or frame.mode
            or exc_type is not None
            or frame.entry.retired
        ):
            return self._exit(stack, frame, t1, exc_type)  # type: ignore[attr-defined]
        stack.pop()
        entry = frame.entry
        buf = entry.buf
        bottom = stack[0]
        buf.append(t1 - frame.start - (0 if self.region else bottom.own - frame.own))
        if len(buf) >= FOLD_AT:
            registry.fold(entry)
        seq0 = frame.seq0
        if timeline.events is not None:
            timeline.add(entry, frame.start, t1, seq0)
        if seq0 >= 0 and frame.anchor:  # walk the anchor's graph or count it
            anchor.log_exit(frame, stack, True)
        elif seq0 >= 0:  # log the node range in the anchor's log (see anchor.Log)
            seq1 = _seq()
            log, outputs = frame.log, frame.outputs
            frame.log = frame.outputs = None
            frame.seq0 = -1
            if seq1 != seq0:
                base = log.seq0
                log.items.append((seq0 - base, seq1 - base, entry, len(stack) - log.depth0, CPU))
                if outputs is not None:
                    log.outputs.append(outputs)
        bottom.own += clock.cpu_now() - t1  # this exit's own time, to the steps still open
        return None


if speedups is not None:
    speedups.bind(
        switches,
        profiler.profiler_state,
        registry,
        anchor.seq_nr,
        clock.cpu_now,
        torch.is_grad_enabled,
        Entry,
        anchor.Log,
        time.perf_counter_ns,
        anchor.log_exit,
        FOLD_AT,
    )
    speedups.set_seq_native(seq_counter_address(anchor.seq_nr if anchor.counts_nodes else None))
    speedups.bind_anchor(
        Entry,
        torch.Tensor,
        sampling.Template,
        sampling,
        anchor,
        anchor.chosen,
        anchor.failed,
        sampling.Count,
        OrderedDict,
        sampling._keys,
        "instrumented_convs",
    )
    speedups.bind_count(sampling.Template, registry._skips, sampling.counted, SKIPS_FOLD_AT)
#: The base class of Step: the C one when the extension is in use, else :class:`PyStepBase`.
StepBase: type = speedups.StepBase if speedups is not None else PyStepBase
