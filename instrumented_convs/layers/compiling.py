"""The advice's ``compiled-layer`` change, timed like every change (:mod:`.trials`) where asked
for (``run --advise-compile``, ``ic.advise(compile=True)``): a deep copy of the layer given to
``torch.compile``, compiled first (forward and backward, its time stated as the change's
once-paid cost), then timed against the stock copy on the layer's own last inputs. A layer
called with new shapes compiles again: said in the advice's condition.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Dict, Optional

import torch

from .trials import Change, forward_backward, register

__all__ = ["compiled_layer"]


def compiled_layer(layer: Any, facts: Dict[str, Any]) -> Optional[Change]:
    """The change to ``torch.compile`` of the layer, compiled here (forward and backward on
    its last inputs, the time it took kept), or None where the layer has no parameters."""
    if not list(layer.parameters()):
        return None
    compiled = torch.compile(copy.deepcopy(layer))
    t0 = time.perf_counter()
    forward_backward(compiled, facts["inputs"])
    return Change(
        "compiled-layer",
        "torch.compile the layer (layer = torch.compile(layer), or the whole model: "
        "model = torch.compile(model))",
        facts["inputs"],
        layer=compiled,
        convert_s=time.perf_counter() - t0,
        convert_once=True,
    )


register("pyg", "compiled-layer", compiled_layer)
register("dgl", "compiled-layer", compiled_layer)
