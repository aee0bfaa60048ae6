"""What ``run`` takes for a model: the module inside DDP, DataParallel and ``torch.compile``
wrappers, the models a compiled function refers to, and a ``torch.fx.GraphModule`` told apart
from the compiled code a backend runs.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from ... import core

__all__ = ["optimized_module", "unwrap", "models_of", "backend_code"]


def optimized_module() -> Optional[type]:
    """The class of what ``torch.compile(model)`` returns (None in a torch without it)."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # pragma: no cover - a torch without Dynamo
        return None
    return OptimizedModule


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP, DataParallel and ``torch.compile`` wrappers (for naming)."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
            inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def models_of(fn: Any) -> List[torch.nn.Module]:
    """The modules a function refers to by name: its bound ``self``, the globals its code
    reads and its closure's cells (one level: not those of the functions it calls)."""
    import inspect

    fn = inspect.unwrap(fn)
    found = [getattr(fn, "__self__", None)]
    code, names = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    if code is not None:
        found += [names.get(n) for n in code.co_names]
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                found.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
    unique = {id(m): m for m in found if isinstance(m, torch.nn.Module)}
    return list(unique.values())


_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def backend_code(module: torch.nn.Module) -> bool:
    """Whether a ``torch.fx.GraphModule`` being called is compiled code a backend runs (inside
    a compiled call, AOTAutograd's boxed graphs, a compiled backward), not a model of the
    script's own (``to_hetero``'s, ``torch.fx.symbolic_trace``'s, ``torch.export``'s)."""
    return bool(
        getattr(module, "_boxed_call", False) or core.inside_compiled() or _graph_task() != -1
    )
