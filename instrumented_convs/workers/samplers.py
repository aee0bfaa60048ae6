"""The loaders' own work as steps, wherever it runs (a worker or the training process):
``sample``, ``filter``, ``collate``, ``features`` and ``pin memory``, each on the CPU clock
(what each covers and where it runs: docs/minibatch.md). A call inside a call of the same
step is one step; classes are patched now if imported, else right after their import. In the
training process each call's time is also the own work of the loader waited for
(:mod:`.charge`).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..core.clocks import cpu as clock
from ..core.steps.step import Step, recording
from . import charge
from .imports import patch_on_import

__all__ = ["TARGETS", "install", "patched"]

logger = logging.getLogger(__name__)

#: module -> ((class or None for a module's function, name, step name), ...). DGL's loader
#: holds its sampler's ``sample`` bound when built (a spawned worker unpickles it before
#: anything of ours runs): ``sample_blocks``, looked up at each call, is timed there.
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
    now = clock.cpu_now

    @functools.wraps(orig)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, name, False) or not recording() or (args and args[0] is None):
            return orig(*args, **kwargs)  # (None: the pin thread passing a control message)
        setattr(_inside, name, True)
        try:
            step.__enter__()
            t0 = now()  # (inside the step: a loader's own work adds up to its rows)
            try:
                out = orig(*args, **kwargs)
            except BaseException:
                step.__exit__(*sys.exc_info())
                raise
            t1 = now()
            step.__exit__(None, None, None)
            if charge.state.waiting is not None:
                charge.own(name, t1 - t0)
            return out
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
    """Time the loaders' work (:data:`TARGETS`) in this process, from now on; returns
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
