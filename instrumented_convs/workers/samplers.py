"""The loaders' own work as steps: neighbour sampling, joining features, collating.

Wherever it runs (a loader's worker process, or the training process: ``num_workers=0``,
or PyG's ``filter_per_worker=False``, which joins the features in the training process),
each of these calls is a step on the CPU clock, named for what it does:

- ``sample``: PyG's ``NeighborSampler.sample_from_nodes`` and ``sample_from_edges``; DGL's
  ``BlockSampler.sample`` and ``NeighborSampler.sample_blocks``;
- ``filter``: PyG's ``NodeLoader.filter_fn`` and ``LinkLoader.filter_fn`` (the batch's
  features and labels joined to the sampled subgraph);
- ``collate``: PyG's ``Collater.__call__`` (``torch_geometric.loader.DataLoader``);
- ``features``: DGL's ``dgl.dataloading.dataloader._prefetch`` (the features and labels
  sliced for the batch, and its copy to the loader's device);
- ``pin memory``: torch's ``pin_memory`` of a batch, in the loader's pin-memory thread
  (``pin_memory=True`` with an accelerator): a row of its own, as that thread's steps are
  its own (at the top level of the table, beside the loop it runs alongside); the
  thread's calls with nothing to pin (the loader's control messages) are no step.

PyG's sampling runs where the batch is made (a worker); its ``filter`` (the batch's
features and labels sliced from the graph's) there too with ``filter_per_worker`` (the
default since PyG 2.4 for data on the CPU), else in the training process, in the loader's
``__next__``. DGL's sampler runs in the worker, its features are sliced (``features``: the
``prefetch_node_feats`` and labels, and the copy to the loader's device) in the training
process, or in DGL's prefetching thread (``use_prefetch_thread``, a CUDA device), each
batch's own step there.

A call inside a call of the same step (a subclass's ``sample_from_nodes`` calling its
parent's; DGL's ``sample`` calling ``sample_blocks``; PyG's ``Collater`` calling itself
for each field) is one step. DGL's loader holds its sampler's ``sample`` bound when built
(a spawned worker unpickles it before anything of ours runs): ``sample_blocks``, looked up
at each call, is timed there. Classes are patched where their module is imported already, and
right after its import otherwise (:func:`.imports.patch_on_import`).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..core.steps.step import Step, recording
from .imports import patch_on_import

__all__ = ["TARGETS", "install", "patched"]

logger = logging.getLogger(__name__)

#: module -> ((class or None for a module's function, name, step name), ...)
TARGETS: Dict[str, Tuple[Tuple[Optional[str], str, str], ...]] = {
    "torch_geometric.sampler.neighbor_sampler": (
        ("NeighborSampler", "sample_from_nodes", "sample"),
        ("NeighborSampler", "sample_from_edges", "sample"),
    ),
    "torch_geometric.loader.node_loader": (("NodeLoader", "filter_fn", "filter"),),
    "torch_geometric.loader.link_loader": (("LinkLoader", "filter_fn", "filter"),),
    "torch_geometric.loader.dataloader": (("Collater", "__call__", "collate"),),
    "dgl.dataloading.base": (("BlockSampler", "sample", "sample"),),
    "dgl.dataloading.neighbor_sampler": (("NeighborSampler", "sample_blocks", "sample"),),
    "dgl.dataloading.dataloader": ((None, "_prefetch", "features"),),
    "torch.utils.data._utils.pin_memory": ((None, "pin_memory", "pin memory"),),
}


_patched: Dict[Tuple[Any, str], Callable[[], None]] = {}  # (owner, name) -> its undo
_lock = threading.Lock()
_inside = threading.local()  # step name -> True while a call of that step is open


def _wrap(owner: Any, attr: str, name: str) -> None:
    orig = vars(owner)[attr]
    step = Step(name, None, "cpu", "step")

    @functools.wraps(orig)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, name, False) or not recording() or (args and args[0] is None):
            return orig(*args, **kwargs)  # (None: the pin thread passing a control message)
        setattr(_inside, name, True)
        try:
            with step:
                return orig(*args, **kwargs)
        finally:
            setattr(_inside, name, False)

    wrapped.__instrumented_convs__ = orig  # type: ignore[attr-defined]
    setattr(owner, attr, wrapped)
    _patched[(owner, attr)] = lambda: setattr(owner, attr, orig)


def _patch(module: Any) -> None:
    with _lock:
        for cls_name, attr, name in TARGETS.get(module.__name__, ()):
            owner = module if cls_name is None else getattr(module, cls_name, None)
            if owner is None or attr not in vars(owner):
                logger.debug("no %s.%s.%s to time", module.__name__, cls_name, attr)
                continue
            if (owner, attr) not in _patched:
                _wrap(owner, attr, name)


def install() -> Callable[[], None]:
    """Time the loaders' work (the module's table) in this process, from now on; returns
    what takes it off again (the calls patched by this call; a second install adds none)."""
    before = set(_patched)
    stop = patch_on_import(TARGETS, _patch)

    def remove() -> None:
        stop()
        with _lock:
            for key in [k for k in _patched if k not in before]:
                _patched.pop(key)()

    return remove


def patched() -> List[Tuple[type, str]]:
    """The calls timed now (for tests)."""
    return list(_patched)
