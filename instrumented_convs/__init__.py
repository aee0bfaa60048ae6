"""instrumented_convs: where the time goes inside graph convolution layers.

Change one import (``from instrumented_convs.pyg import GCNConv``), train as before, then
``print(registry.summary())``: every internal step of every layer, timed (CUDA events on a
GPU, no per-step synchronize), nested, and shown as NVTX ranges and profiler labels.

This module is the face, every name a user calls (``__all__``):

- :func:`region`: time a block of your own code (an epoch, its forward, the loss);
- :func:`instrument` / :func:`uninstrument`: swap a built model's conv layers for ours and
  back; :func:`name_layers`: name each layer after its attribute path;
- :data:`registry`: ``registry.summary()`` reads the table, ``registry.reset()`` empties it;
- :func:`configure`: every switch (recording, NVTX, profiler labels, backward timing),
  returning the :class:`Settings` it replaced (a context manager that puts them back).

What a summary is made of (``Summary``, ``Row``, the renderers) is in
:mod:`instrumented_convs.report`; steps for layers of your own are in
:mod:`instrumented_convs.layers`; the drop-in layers in :mod:`instrumented_convs.pyg` and
:mod:`instrumented_convs.dgl`. docs/architecture.rst shows the private modules behind them.
"""

from . import distributed as _distributed  # noqa: F401  (registers registry.summary()'s reader)
from .core.registry import registry
from .core.settings import Settings, configure
from .core.step import region
from .layers.contract import name_layers
from .layers.instrument import instrument, uninstrument

__version__ = "0.1.0"

__all__ = [
    "region",
    "instrument",
    "uninstrument",
    "name_layers",
    "registry",
    "configure",
    "Settings",
]
