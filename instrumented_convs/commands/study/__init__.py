"""The study: a 3-layer GCN profiled with the instrumented PyG and DGL layers.

It reproduces a published profiling of a 3-layer GCN on ogbn-arxiv and Cora with PyG and
DGL, which timed the layers' steps by copying their source and inserting timers, with the
package's public face alone: graphs (:mod:`.data`), models (:mod:`.models`), the training
loops (:mod:`.loop`, :mod:`.minibatch`), PyG and DGL side by side (:mod:`.compare`), the
cost (:mod:`.bench`) and the command lines (:mod:`.cli`).
"""

from .cli import add_study_arguments, study_main
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
from .runner import StudyRun, report, run_study, write_json

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
