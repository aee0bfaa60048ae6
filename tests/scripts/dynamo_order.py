"""A frame of ours marked to be skipped, with Dynamo imported before the package (``first``) or
after (``after``: the mark waits for it), then a compiled model whose call of it breaks the
graph. Prints JSON: whether importing the package imported Dynamo, what the frame saw, the
output, and Dynamo's frame counters (the skipped frame is not compiled on its own).

python dynamo_order.py first|after
"""

import json
import sys

if sys.argv[1] == "first":
    import torch._dynamo  # noqa: F401

import torch

import instrumented_convs  # noqa: F401
from instrumented_convs.core.compiler import dynamo

imported = "torch._dynamo" in sys.modules
seen = []


def layer(x: torch.Tensor) -> torch.Tensor:
    seen.append(dynamo.inside_compiled())
    x = x * 2
    torch._dynamo.graph_break()
    return x + 1


dynamo.skip_frame(layer)

import torch._dynamo  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402


def model(x: torch.Tensor) -> torch.Tensor:
    return layer(x + 1) + 1


out = torch.compile(model, backend="eager")(torch.ones(2))
print(json.dumps({
    "dynamo_imported": imported,
    "seen": seen,
    "out": out.tolist(),
    "frames": dict(counters["frames"]),
    "constant": getattr(dynamo.compiling, "_dynamo_marked_constant", False),
}))  # fmt: skip
