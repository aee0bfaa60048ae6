"""DGL's message passing and fused kernels as steps inside every generic DGL layer.

DGL layers call the graph's methods (``graph.update_all``, ``graph.apply_edges``), the
function ``edge_softmax``, and under them DGL's fused sparse kernels, the autograd functions
``GSpMM``, ``GSDDMM``, ``EdgeSoftmax`` (and their ``_hetero`` variants) of
``dgl/backend/pytorch/sparse.py``, plus ``SEGMENTMM``/``GATHERMM`` (typed linear layers).
Every caller reaches a kernel as ``<Function>.apply(...)`` and a graph method through the
class, both looked up at call time, so wrapping these attributes (once, when the first
generic DGL layer is built) sees every call without copying any DGL code. Steps::

    update_all        graph.update_all: message + reduce (multi_update_all likewise)
      gspmm           the fused message-and-reduce kernel (builtin message functions)
    apply_edges       graph.apply_edges
      gsddmm          the fused edge kernel
    in_degrees, out_degrees   graph.in_degrees / out_degrees (degree normalisations, checks)
    edge_softmax      the fused edge softmax (dgl.ops.edge_softmax)
    segment_mm, gather_mm

A wrapper records only while a generic layer's forward runs on this thread
(:data:`._generic.framework_steps`); everywhere else (stock layers, user code, the detailed
``GraphConv`` and ``EdgeWeightNorm``, which set that depth to 0 while they run: their copies
time DGL's calls as steps of their own) it calls DGL's own function after one thread-local read.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Dict, List, Tuple

import torch

from . import _counters, _formulas
from ._generic import GenericLayer, framework_steps
from ._scan import any_function, torch_function
from ._step import Step, recording

__all__ = ["GenericDGL", "install", "uninstall", "WRAPPED", "make_all", "NOT_INSTRUMENTED"]

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
    ("dgl.backend.pytorch.sparse", "GSpMM", "apply", "gspmm"),
    ("dgl.backend.pytorch.sparse", "GSpMM_hetero", "apply", "gspmm"),
    ("dgl.backend.pytorch.sparse", "GSDDMM", "apply", "gsddmm"),
    ("dgl.backend.pytorch.sparse", "GSDDMM_hetero", "apply", "gsddmm"),
    ("dgl.backend.pytorch.sparse", "EdgeSoftmax", "apply", "edge_softmax"),
    ("dgl.backend.pytorch.sparse", "EdgeSoftmax_hetero", "apply", "edge_softmax"),
    ("dgl.backend.pytorch.sparse", "SEGMENTMM", "apply", "segment_mm"),
    ("dgl.backend.pytorch.sparse", "GATHERMM", "apply", "gather_mm"),
)


#: Kernels the counters have a formula for (``_formulas.dgl_cost``).
FORMULA_KERNELS = ("gspmm", "gsddmm")
#: Graph methods computed in DGL's C library, unseen by the dispatcher: listed by name.
_DEGREES = ("in_degrees", "out_degrees")


def _wrap(fn: Callable[..., Any], name: str, method: bool) -> Any:
    """``fn`` inside the step ``name`` while a generic layer runs on this thread."""
    st = Step(name)

    op = f"dgl.{name}"

    formula = name in FORMULA_KERNELS

    def counted(args: Any, kwargs: Any) -> Any:  # a kernel the dispatcher cannot see
        out = fn(*args, **kwargs)
        _counters.mark(op, _formulas.dgl_cost(name, args, out) if formula else None)
        return out

    counts = not method or name in _DEGREES  # what runs in DGL's own library, unseen

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        count = counts and _counters._mode is not None
        if not framework_steps.n or not recording():
            return counted(args, kwargs) if count else fn(*args, **kwargs)
        with st:
            return counted(args, kwargs) if count else fn(*args, **kwargs)

    wrapper._ic_wrapped = name  # type: ignore[attr-defined]
    return wrapper if method else staticmethod(wrapper)


def _marked(fn: Any, op: str) -> Any:
    """A kernel's backward that marks its call for the counters (see ``_counters.mark``)."""

    @functools.wraps(fn)
    def backward(*args: Any, **kwargs: Any) -> Any:
        _counters.mark(op)
        return fn(*args, **kwargs)

    backward._ic_wrapped = op  # type: ignore[attr-defined]
    return staticmethod(backward)


def install() -> None:
    """Wrap DGL's graph methods and kernels (:data:`WRAPPED`); idempotent, thread-safe."""
    import importlib

    with _lock:
        if _installed:
            return
        for module, owner_name, attr, name in WRAPPED:
            owner = getattr(importlib.import_module(module), owner_name, None)
            fn = getattr(owner, attr, None) if owner is not None else None
            if fn is None or hasattr(fn, "_ic_wrapped"):
                if owner is not None:
                    logger.debug("DGL has no %s.%s.%s: not timed", module, owner_name, attr)
                continue
            original = owner.__dict__.get(attr)  # None: inherited (Function.apply)
            method = attr != "apply"  # a graph method, or an autograd Function's classmethod
            setattr(owner, attr, _wrap(fn, name, method))
            _installed.append((owner, attr, original))
            # Its backward, marked for the counters where its kernels may run unseen (those
            # of gspmm and gsddmm call the two kernels again, through apply: counted).
            if attr == "apply" and "backward" in owner.__dict__ and name not in FORMULA_KERNELS:
                original = owner.__dict__["backward"]
                setattr(owner, "backward", _marked(owner.backward, f"dgl.{name}.backward"))
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


class GenericDGL(GenericLayer):
    """Mixin of the generic DGL layers: DGL's message passing and kernels as steps."""

    def _ic_after_init(self) -> None:
        """Timed children, and DGL's graph methods and kernels wrapped (once per process)."""
        super()._ic_after_init()
        install()


_counters.on_start.append(install)  # the counters mark DGL's kernels, whatever layer runs
if _counters.is_on():
    install()

#: Classes of ``dgl.nn.pytorch.conv.__all__`` that get no instrumented version, and why.
NOT_INSTRUMENTED: Dict[str, str] = {}


def make_all(module: str, detailed: frozenset) -> Dict[str, type]:
    """A generic instrumented class for every class of ``dgl.nn.pytorch.conv.__all__`` not in
    ``detailed`` or :data:`NOT_INSTRUMENTED`, named as upstream, living in ``module``."""
    import dgl.nn.pytorch.conv as conv

    from ._generic import make_all as make

    return make(conv, module, GenericDGL, detailed, NOT_INSTRUMENTED, vocabulary=VOCABULARY)


#: What a DGL layer's forward calls that is timed as a step during its calls (:mod:`._route`):
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
