"""A batch's copy to its device, as the region ``copy``: PyG's ``Data.to`` and DGL's
``DGLGraph.to``. Timed like the loop's other regions (CUDA events at the top level once CUDA is
initialised, so a ``non_blocking`` copy's time is the device's). A batch of plain tensors has
no such call: its copies are in the rest of the iteration.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, List, Tuple

from ..core.steps.step import Step, recording
from .imports import patch_on_import

__all__ = ["COPY", "TARGETS", "install"]

COPY = "copy"  #: the region's name
#: module -> (class, method) whose calls are copies of a batch
TARGETS: Dict[str, Tuple[str, str]] = {
    "torch_geometric.data.data": ("BaseData", "to"),
    "dgl.heterograph": ("DGLGraph", "to"),
}


def install() -> Callable[[], None]:
    """Time a batch's copies to its device (:data:`TARGETS`) from now on; returns what puts
    them back."""
    undo: List[Callable[[], None]] = []
    region = Step(COPY, None, None, "region")
    inside = threading.local()

    def patch(module: Any) -> None:
        cls_name, attr = TARGETS[module.__name__]
        cls = getattr(module, cls_name, None)
        if cls is None or attr not in vars(cls):
            return
        orig = vars(cls)[attr]

        @functools.wraps(orig)
        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "on", False) or not recording():
                return orig(self, *args, **kwargs)
            inside.on = True
            try:
                with region:
                    return orig(self, *args, **kwargs)
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
