"""``to_hetero``'s copies of instrumented layers named after their relation.

``to_hetero`` deep-copies each layer of a model once per edge type (or node type); copies
of a drop-in layer would share its name, their rows merged. Nothing of ours runs when the
copies are made or when the transformed model is called (a ``torch.fx.GraphModule``), so
the transformer's ``init_submodule`` is wrapped, once, when this package is imported: each
copy is named ``<attribute>.<key>`` (``conv1.author__writes__paper``) and given its relation.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from ..layers.contract import InstrumentedLayer, is_default_scope
from ..layers.relations import SEPARATOR, canonical

__all__ = ["install"]

logger = logging.getLogger(__name__)


def _name_copies(copies: torch.nn.ModuleDict, target: str) -> None:
    """Name the instrumented layers of each copy in ``copies`` (``to_hetero``'s dict for the
    attribute ``target``) after the key, and give them its relation (an edge type's)."""
    for key, copy in copies.items():
        shown = canonical(key)
        relation = shown if SEPARATOR in shown else None  # (a node type's copy: none)
        for sub, layer in copy.named_modules():
            if not isinstance(layer, InstrumentedLayer):
                continue
            base = target if is_default_scope(layer) else layer.scope
            layer.scope = f"{base}.{shown}" + (f".{sub}" if sub else "")
            if relation is not None:
                layer.relation = relation


def install() -> None:
    """Wrap ``ToHeteroTransformer.init_submodule`` (once per process); where this PyG has no
    such method, the copies keep one name (``name_layers`` or ``run`` name them)."""
    try:
        from torch_geometric.nn.to_hetero_transformer import ToHeteroTransformer
    except ImportError:  # pragma: no cover - a PyG without to_hetero
        return
    original = ToHeteroTransformer.__dict__.get("init_submodule")
    if original is None or getattr(original, "_ic_wrapped", False):
        if original is None:
            logger.debug("this PyG's to_hetero has no init_submodule: copies not named")
        return

    @functools.wraps(original)
    def init_submodule(self: Any, module: torch.nn.Module, target: str) -> Any:
        out = original(self, module, target)
        if out is not module and isinstance(out, torch.nn.ModuleDict):
            _name_copies(out, target)
        return out

    init_submodule._ic_wrapped = True  # type: ignore[attr-defined]
    ToHeteroTransformer.init_submodule = init_submodule  # type: ignore[method-assign]
