"""The advice's ``lower-precision`` change, timed like every change (:mod:`.trials`): the layer
run under ``torch.autocast`` in bfloat16, its matrix products in 8 bits of mantissa and its
parameters left float32, given its inputs as a model under autocast gives them (another
layer's output in bfloat16, so that its sums move half the bytes). Not the same numbers: its
outputs and gradients are compared against :data:`TOLERANCE`, said in the advice, and it is
advised only where it was faster (on a CPU without bfloat16 instructions it is slower).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Optional

import torch

from .trials import Change, register

__all__ = ["TOLERANCE", "Autocast", "lower_precision"]

#: The largest difference of outputs and gradients, relative to the largest value, within
#: which bfloat16 is taken as the same model: its step is 2**-8 (0.4%) of a value, and a sum
#: of many rounded terms drifts by several steps.
TOLERANCE = 3e-2


class Autocast(torch.nn.Module):
    """``layer`` called under ``torch.autocast(device_type, dtype=torch.bfloat16)``."""

    def __init__(self, layer: torch.nn.Module, device_type: str) -> None:
        """Wrap ``layer`` (its parameters are this module's)."""
        super().__init__()
        self.layer, self.device_type = layer, device_type

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The layer's forward under autocast (its backward follows the recorded dtypes)."""
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.layer(*args, **kwargs)


def _as_autocast_gives(value: Any) -> Any:
    """An input as it comes to the layer in a model run under autocast: a float32 tensor that
    requires a gradient (another layer's output) in bfloat16; the data (no gradient) as is."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad and value.dtype == torch.float32:
            return value.detach().to(torch.bfloat16).requires_grad_()
        return value
    if isinstance(value, tuple):
        return tuple(_as_autocast_gives(v) for v in value)
    return value


def lower_precision(layer: Any, facts: Dict[str, Any]) -> Optional[Change]:
    """The change to bfloat16 autocast for a layer whose parameters are float32 on a CPU or a
    CUDA device that has bfloat16, or None."""
    params = list(layer.parameters())
    if not params or any(p.dtype != torch.float32 for p in params):
        return None
    device = params[0].device.type
    args, kwargs = facts["inputs"]
    if device not in ("cpu", "cuda") or (device == "cuda" and not torch.cuda.is_bf16_supported()):
        return None
    return Change(
        "lower-precision",
        f"with torch.autocast({device!r}, dtype=torch.bfloat16): around the model's forward and "
        "its loss (backward outside it)",
        (_as_autocast_gives(args), {k: _as_autocast_gives(v) for k, v in kwargs.items()}),
        layer=Autocast(copy.deepcopy(layer), device),
        tolerance=TOLERANCE,
    )


register("pyg", "lower-precision", lower_precision)
register("dgl", "lower-precision", lower_precision)
