"""A batch's copy to its device, as the region ``copy``: PyG's ``Data.to`` and DGL's
``DGLGraph.to``, called by the training loop or a loader (:func:`batch_copy`), not by a
library's own code (``dgl.graph`` calls ``.to`` on every graph it builds). Timed like the
loop's other regions (CUDA events at the top level once CUDA is initialised, so a
``non_blocking`` copy's time is the device's). A batch of plain tensors has no such call: its
copies are in the rest of the iteration. Each copy's host time is also its loader's
(:mod:`.charge`): the loader waited for, or the one whose batch was handed over last.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, Dict, List, Tuple

from ..core.clocks import cpu as clock
from ..core.steps.step import Step, recording
from . import charge
from .imports import patch_on_import

__all__ = ["COPY", "TARGETS", "LIBRARIES", "LOADERS", "batch_copy", "install"]

COPY = "copy"  #: the region's name
#: module -> (class, method) whose calls are copies of a batch
TARGETS: Dict[str, Tuple[str, str]] = {
    "torch_geometric.data.data": ("BaseData", "to"),
    "dgl.heterograph": ("DGLGraph", "to"),
}
#: Packages whose own calls of a target are no batch copy (a graph built, a subgraph moved)...
LIBRARIES = ("dgl", "torch_geometric", "torch")
#: ...but for these parts of them, which copy a loader's batches to their device.
LOADERS = (
    "dgl.dataloading",
    "torch_geometric.loader",
    "torch_geometric.transforms.to_device",
    "torch.utils.data",
)


def _within(module: str, packages: Tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``packages`` or inside one."""
    return any(module == p or module.startswith(p + ".") for p in packages)


def batch_copy(frame: Any, target: str) -> bool:
    """Whether the call of a target's ``to`` from ``frame`` copies a batch: the first frame
    outside ``target``'s module (a graph's ``cpu()`` calls its ``to``) is the training
    loop's (a script, a framework such as Lightning) or a loader's (:data:`LOADERS`), not
    a graph library's own code (:data:`LIBRARIES`)."""
    while frame is not None and frame.f_globals.get("__name__") == target:
        frame = frame.f_back
    module = "" if frame is None else str(frame.f_globals.get("__name__") or "")
    return not _within(module, LIBRARIES) or _within(module, LOADERS)


def install() -> Callable[[], None]:
    """Time a batch's copies to its device (:data:`TARGETS`) from now on; returns what puts
    them back."""
    undo: List[Callable[[], None]] = []
    region = Step(COPY, None, None, "region")
    inside = threading.local()
    now = clock.cpu_now

    def patch(module: Any) -> None:
        cls_name, attr = TARGETS[module.__name__]
        cls = getattr(module, cls_name, None)
        if cls is None or attr not in vars(cls):
            return
        orig = vars(cls)[attr]

        @functools.wraps(orig)
        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            if (
                getattr(inside, "on", False)
                or not recording()
                or not batch_copy(sys._getframe(1), module.__name__)
            ):
                return orig(self, *args, **kwargs)
            inside.on = True
            try:
                region.__enter__()
                t0 = now()  # (inside the region: a loader's copies add up to its rows)
                try:
                    out = orig(self, *args, **kwargs)
                except BaseException:
                    region.__exit__(*sys.exc_info())
                    raise
                t1 = now()
                region.__exit__(None, None, None)
                charge.copied(t1 - t0)  # the host's time, for the loader's split
                return out
            finally:
                inside.on = False

        setattr(cls, attr, to)
        undo.append(lambda: setattr(cls, attr, orig))

    stop = patch_on_import(TARGETS, patch)

    def remove() -> None:
        stop()
        while undo:
            undo.pop()()

    return remove
