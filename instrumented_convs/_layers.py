"""What the instrumented layers share: default scope names per instance, and naming them."""
from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, Iterator, Tuple

import torch

from ._step import Step

_counters: Dict[str, Iterator[int]] = {}
_lock = threading.Lock()


def instance_scope(kind: str) -> str:
    """A fresh default scope for a layer instance: ``GCNConv#0``, ``GCNConv#1``, ..."""
    with _lock:
        counter = _counters.setdefault(kind, itertools.count())
        return f"{kind}#{next(counter)}"


def layer_step(module: Any, kind: str, device: torch.device) -> Step:
    """The layer's own top-level step for this device, built once per (scope, device).

    A layer calls this once per forward instead of ``step(kind, scope=..., device=...)``,
    which would build a new step object every call.
    """
    cache = module.__dict__.setdefault("_ic_steps", {})
    key = (module._ic_scope, device)
    s = cache.get(key)
    if s is None:
        s = cache[key] = Step(kind, scope=module._ic_scope, device=device)
    return s


def share_state(src: torch.nn.Module, dst: torch.nn.Module, names: Tuple[str, ...]) -> Any:
    """Make ``dst`` use ``src``'s attributes ``names`` (parameters, submodules, caches; None
    skipped) and its train/eval mode; return ``dst``. Used by ``to_stock``/``from_stock``."""
    for name in names:
        value = getattr(src, name)
        if value is not None:
            setattr(dst, name, value)
    dst.train(src.training)
    return dst


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
