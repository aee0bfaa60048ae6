"""The study: a 3-layer GCN profiled with the instrumented PyG and DGL layers.

The study is a published profiling of a 3-layer GCN on ogbn-arxiv and Cora with PyG and
DGL, which timed the layers' internal steps by copying the layers' source and inserting
timers. This subpackage reproduces it with the instrumented layers, as reusable pieces:

- :mod:`~instrumented_convs.commands.study.data`: generated graphs of the datasets' shapes
  (:data:`SHAPES`, :func:`synthetic_graph`) and the real loaders (:func:`load_graph`);
- :mod:`~instrumented_convs.commands.study.models`: the 3-layer GCN for PyG and DGL
  (:func:`build_model`);
- :mod:`~instrumented_convs.commands.study.loop`: the training loop with timed epoch phases
  (:func:`train`);
- :mod:`~instrumented_convs.commands.study.minibatch`: mini-batch training on neighbour-sampled
  subgraphs (PyG ``NeighborLoader``, DGL blocks), the loader timed too, optionally under
  ``DistributedDataParallel``; :mod:`~instrumented_convs.commands.study.minibatch_cli` is the
  command line of ``examples/minibatch.py`` and ``examples/ddp.py``;
- :mod:`~instrumented_convs.commands.study.compare` and
  :mod:`~instrumented_convs.commands.study.plot`: PyG and DGL side by side, aligned by role, as a
  table and as a chart;
- :mod:`~instrumented_convs.commands.study.bench`: what the instrumentation costs (stock vs
  instrumented);
- :mod:`~instrumented_convs.commands.study.run`: one run of the study from its command line (the
  examples' :func:`study_main`); :mod:`~instrumented_convs.commands.study.cli`:
  ``python -m instrumented_convs demo|compare|bench``.

It uses only the package's public face (``region``, ``registry``, ``configure``,
``name_layers``, ``instrumented_convs.pyg`` / ``.dgl``).
"""

from .cli import StudyRun, add_study_arguments, report, run_study, study_main, write_json
from .data import (
    SHAPES,
    DatasetNotFound,
    GraphData,
    MissingDependency,
    load_graph,
    scaled_shape,
    synthetic_graph,
)
from .loop import TrainResult, accuracy, train
from .models import DglGCN, PygGCN, build_model, require_torch_sparse

__all__ = [
    "SHAPES",
    "scaled_shape",
    "GraphData",
    "synthetic_graph",
    "load_graph",
    "DatasetNotFound",
    "MissingDependency",
    "PygGCN",
    "DglGCN",
    "build_model",
    "require_torch_sparse",
    "TrainResult",
    "train",
    "accuracy",
    "StudyRun",
    "add_study_arguments",
    "run_study",
    "report",
    "write_json",
    "study_main",
]
