"""DGL's message passing and fused kernels as steps inside every generic DGL layer
(``update_all``, ``apply_edges``, ``gspmm``, ``gsddmm``, ``edge_softmax``...: docs/dgl.rst).

Callers reach a kernel as ``<Function>.apply(...)`` and a graph method through the class,
both looked up at call time, so wrapping these attributes once sees every call without
copying DGL code. A wrapper records only inside a generic layer's forward.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, FrozenSet, List, Tuple

import torch

from ..core.steps.step import mark_outputs
from ..layers.contract import InstrumentedLayer
from ..layers.generic import GenericLayer, framework_steps, make_class
from ..layers.statements.routes import any_function, torch_function
from .kernels import FORMULA_KERNELS, grad_in_backward, marked, scopes, wrap

__all__ = [
    "GenericDGL",
    "install",
    "uninstall",
    "WRAPPED",
    "make_all",
    "NOT_INSTRUMENTED",
    "scopes",
    "Detailed",
    "fallback",
    "hetero_graph_conv",
]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_installed: List[Tuple[Any, str, Any]] = []  # (owner, attribute, original)

#: What is wrapped: (module path, class name, attribute, step name).
WRAPPED = (
    ("dgl.heterograph", "DGLGraph", "update_all", "update_all"),
    ("dgl.heterograph", "DGLGraph", "multi_update_all", "update_all"),
    ("dgl.heterograph", "DGLGraph", "apply_edges", "apply_edges"),
    ("dgl.heterograph", "DGLGraph", "in_degrees", "in_degrees"),
    ("dgl.heterograph", "DGLGraph", "out_degrees", "out_degrees"),
    ("dgl.heterograph", "DGLGraph", "local_scope", "local_scope"),
    ("dgl.heterograph", "DGLGraph", "add_self_loop", "add_self_loop"),
    ("dgl.heterograph", "DGLGraph", "remove_self_loop", "remove_self_loop"),
    ("dgl.heterograph", "DGLGraph", "adj_tensors", "adj_tensors"),
    ("dgl.backend.pytorch.sparse", "GSpMM", "apply", "gspmm"),
    ("dgl.backend.pytorch.sparse", "GSpMM_hetero", "apply", "gspmm"),
    ("dgl.backend.pytorch.sparse", "GSDDMM", "apply", "gsddmm"),
    ("dgl.backend.pytorch.sparse", "GSDDMM_hetero", "apply", "gsddmm"),
    ("dgl.backend.pytorch.sparse", "EdgeSoftmax", "apply", "edge_softmax"),
    ("dgl.backend.pytorch.sparse", "EdgeSoftmax_hetero", "apply", "edge_softmax"),
    ("dgl.backend.pytorch.sparse", "SEGMENTMM", "apply", "segment_mm"),
    ("dgl.backend.pytorch.sparse", "GATHERMM", "apply", "gather_mm"),
)


def install() -> None:
    """Wrap DGL's graph methods and kernels (:data:`WRAPPED`), and ``torch.autograd.grad``
    (:func:`.kernels.grad_in_backward`); idempotent, thread-safe."""
    import importlib

    with _lock:
        if _installed:
            return
        if not hasattr(torch.autograd.grad, "_ic_wrapped"):
            original = torch.autograd.__dict__["grad"]
            torch.autograd.grad = grad_in_backward(original)
            _installed.append((torch.autograd, "grad", original))
        for module, owner_name, attr, name in WRAPPED:
            owner = getattr(importlib.import_module(module), owner_name, None)
            fn = getattr(owner, attr, None) if owner is not None else None
            if fn is None or hasattr(fn, "_ic_wrapped"):
                if owner is not None:
                    logger.debug("DGL has no %s.%s.%s: not timed", module, owner_name, attr)
                continue
            original = owner.__dict__.get(attr)  # None: inherited (Function.apply)
            method = attr != "apply"  # a graph method, or an autograd Function's classmethod
            setattr(owner, attr, wrap(fn, name, method))
            _installed.append((owner, attr, original))
            # Its backward, marked for the counters where its kernels may run unseen (those
            # of gspmm and gsddmm call the two kernels again, through apply: counted).
            if attr == "apply" and "backward" in owner.__dict__ and name not in FORMULA_KERNELS:
                original = owner.__dict__["backward"]
                setattr(owner, "backward", marked(owner.backward, f"dgl.{name}.backward"))
                _installed.append((owner, "backward", original))


def uninstall() -> None:
    """Give DGL its own graph methods and kernels back (benchmarks compare both states)."""
    with _lock:
        while _installed:
            owner, attr, original = _installed.pop()
            if original is None:
                delattr(owner, attr)  # it was inherited (autograd.Function.apply)
            else:
                setattr(owner, attr, original)


class Detailed(InstrumentedLayer):
    """Mixin of the detailed DGL layers (``instrumented_convs.dgl``): DGL's ``local_scope``
    timed inside them too (:data:`scopes`), and a fallback's children (none) not skipped."""

    _ic_skip: FrozenSet[str] = frozenset()

    def _ic_after_init(self) -> None:
        """As every instrumented layer, and DGL's methods wrapped (once per process)."""
        super()._ic_after_init()
        install()

    def _ic_run(self, graph: Any, copy: Callable[..., Any], *args: Any) -> Any:
        """``copy(self, graph, *args)`` (upstream's forward with steps) in the layer's step;
        DGL's calls are the copy's own steps there, also inside a generic layer, but for
        ``local_scope``."""
        depth, framework_steps.n = framework_steps.n, 0
        scopes.n += 1
        try:
            with self._ic_step(graph.device):
                return mark_outputs(copy(self, graph, *args))
        finally:
            framework_steps.n = depth
            scopes.n -= 1


def fallback(stock: type, module: str) -> type:
    """Where the installed DGL differs from a detailed layer's copy: a generic class of
    ``stock`` whose forward runs upstream's as every generic layer runs its own (DGL's graph
    methods and kernels, the functions it calls and its own statements as steps): coarser
    than the copy's steps, the same numbers as upstream's."""
    return make_class(stock, module, GenericDGL, None, VOCABULARY)


class GenericDGL(GenericLayer):
    """Mixin of the generic DGL layers: DGL's message passing and kernels as steps."""

    def _ic_after_init(self) -> None:
        """Timed children, and DGL's graph methods and kernels wrapped (once per process)."""
        super()._ic_after_init()
        install()


#: Classes of ``dgl.nn.pytorch.conv.__all__`` that get no instrumented version, and why.
NOT_INSTRUMENTED: Dict[str, str] = {}


def make_all(module: str, detailed: frozenset) -> Dict[str, type]:
    """A generic instrumented class for every class of ``dgl.nn.pytorch.conv.__all__`` not in
    ``detailed`` or :data:`NOT_INSTRUMENTED`, named as upstream, living in ``module``."""
    import dgl.nn.pytorch.conv as conv

    from ..layers.generic import make_all as make

    return make(conv, module, GenericDGL, detailed, NOT_INSTRUMENTED, vocabulary=VOCABULARY)


def hetero_graph_conv(module: str) -> type:
    """The generic instrumented ``dgl.nn.HeteroGraphConv`` (not a conv module of DGL's, but
    the one a heterograph model is built of), living in ``module``."""
    from dgl.nn.pytorch import HeteroGraphConv

    return make_class(HeteroGraphConv, module, GenericDGL, None, VOCABULARY)


#: What a DGL layer's forward calls that is timed as a step during its calls
#: (:mod:`~instrumented_convs.layers.statements.routes`):
#: DGL's own functions (``dgl.add_self_loop``, ``reverse``...; not the kernels' own steps),
#: ``F.<function>`` and most ``torch.<function>`` (``th.pow`` of the degree normalisation;
#: not views, predicates or grad modes).
VOCABULARY = (
    ("dgl",),
    {
        "torch.nn.functional": any_function,
        "torch": torch_function,
        "dgl": any_function,
    },
    frozenset(name for *_, name in WRAPPED),
    frozenset(attr for _, _, attr, _ in WRAPPED if attr != "apply"),
    (torch.nn.Module,),
)
