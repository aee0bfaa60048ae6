"""What the instrumented layers share: default scope names per instance, and naming them."""
from __future__ import annotations

import itertools
import threading
from typing import Dict, Iterator

import torch

_counters: Dict[str, Iterator[int]] = {}
_lock = threading.Lock()


def instance_scope(kind: str) -> str:
    """A fresh default scope for a layer instance: ``GCNConv#0``, ``GCNConv#1``, ..."""
    with _lock:
        counter = _counters.setdefault(kind, itertools.count())
        return f"{kind}#{next(counter)}"


def name_layers(model: torch.nn.Module, prefix: str = "") -> Dict[str, str]:
    """Name every instrumented layer in ``model`` after its attribute path (``convs.0``).

    ``registry.summary(by="layer")`` then shows ``convs.0`` instead of ``GCNConv#0``.
    Returns the mapping from old to new scope names.
    """
    renamed = {}
    for name, module in model.named_modules(prefix=prefix):
        if hasattr(module, "_ic_scope"):
            new = name or type(module).__name__
            renamed[module._ic_scope] = new
            module._ic_scope = new
    return renamed
