"""For people who instrument their own layers: steps, output marking, the gate, paths.

A user of the drop-in layers needs none of this (see :mod:`instrumented_convs`). A layer
author times the internal steps of a layer of their own the way the drop-ins do::

    from instrumented_convs.layers import mark_outputs, recording, step

    class MyConv(torch.nn.Module):
        def forward(self, x, edge_index):
            if not recording():              # disabled, or inside a torch.compile trace
                return self._forward(x, edge_index)
            with step("MyConv", scope="conv1"):     # the layer's own step
                with step("lin"):
                    h = self.lin(x)
                with step("propagate"):
                    out = self.propagate(edge_index, x=h)
                return mark_outputs(out)      # the tensors the outer step produced

- :func:`step` (a context manager and a decorator) times a block, pushes an NVTX range and
  a profiler label with its name, and nests under the step open around it: its path is
  ``MyConv/propagate``. ``scope`` names the layer instance (``summary(by="layer")``),
  ``device`` the device whose clock times it (CUDA events on a CUDA device).
- Backward: a step's backward rows (``[backward]`` of each step, per step of the forward)
  are found from the tensors the outermost step produced. Pass them to
  :func:`mark_outputs` before the step's block ends, as above; a step decorating a
  function marks its return value itself. A step whose outputs are not marked gets its
  backward counted and timed only where its autograd graph can be reached from tensors
  marked by an enclosing step.
- :func:`recording` is the one gate: whether steps record right now (enabled, and not
  inside a ``torch.compile`` trace). Check it once per forward and run the plain code when
  it is False, as the drop-ins do.
- :func:`current_path` is the path of the innermost open step on this thread.

For tools (``run``): :class:`InstrumentedLayer`, the base of every instrumented layer (the
contract, :mod:`.contract`), to tell ours from others; not in ``__all__``.
"""

from __future__ import annotations

from ..core.steps.step import Step, current_path, mark_outputs, recording, step
from .contract import InstrumentedLayer  # noqa: F401  (for tools: see the docstring)

__all__ = ["step", "Step", "mark_outputs", "recording", "current_path"]
