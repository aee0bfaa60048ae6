"""The wrappers that make DGL's graph methods, kernels and ``torch.autograd.grad`` steps
(installed by :mod:`.generic`). Each records only while a generic layer's forward runs on
this thread, and otherwise calls DGL's own function. Their frames are not offered to Dynamo,
so after a graph break Dynamo compiles DGL's frames as it does without us.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from ..core.compiler.dynamo import skip_frame
from ..core.frames.stack import thread_stack
from ..core.meters import counters, formulas, memory
from ..core.steps.step import Step, recording
from ..layers.generic import framework_steps

__all__ = ["FORMULA_KERNELS", "scopes", "wrap", "marked", "grad_in_backward"]


#: Kernels the counters have a formula for (``core.meters.formulas.dgl_cost``).
FORMULA_KERNELS = ("gspmm", "gsddmm")
#: Graph methods computed in DGL's C library, unseen by the dispatcher: listed by name.
_DEGREES = ("in_degrees", "out_degrees")


class _Scope:
    """``graph.local_scope()`` while a generic layer runs: entering it (DGL copies the graph's
    feature frames) in the step ``local_scope``, leaving it (the local features dropped, the
    frames put back) in ``local_scope_exit``."""

    __slots__ = ("cm",)
    enter, exit = Step("local_scope"), Step("local_scope_exit")

    def __init__(self, cm: Any) -> None:
        self.cm = cm

    def __enter__(self) -> Any:
        with self.enter:
            return self.cm.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        with self.exit:
            return self.cm.__exit__(*exc)


class _Scopes(threading.local):
    """How many detailed DGL layers' forwards run on this thread (dgl.py counts them)."""

    n = 0


#: Where ``graph.local_scope()`` is timed besides generic layers: inside the detailed DGL
#: layers, whose copies time DGL's other calls themselves (``framework_steps`` is 0 there).
scopes = _Scopes()


def _scope(fn: Callable[..., Any]) -> Any:
    """``DGLGraph.local_scope`` timed (:class:`_Scope`) while a generic layer (or a detailed
    one) runs here."""

    @functools.wraps(fn)
    def local_scope(graph: Any) -> Any:
        if not (framework_steps.n or scopes.n) or not recording():
            return fn(graph)
        return _Scope(fn(graph))

    local_scope._ic_wrapped = "local_scope"  # type: ignore[attr-defined]
    return skip_frame(local_scope)


def wrap(fn: Callable[..., Any], name: str, method: bool) -> Any:
    """``fn`` inside the step ``name`` while a generic layer runs on this thread."""
    if name == "local_scope":
        return _scope(fn)
    st = Step(name)

    op = f"dgl.{name}"

    formula = name in FORMULA_KERNELS

    def counted(args: Any, kwargs: Any) -> Any:  # a kernel the dispatcher cannot see
        out = fn(*args, **kwargs)
        if counters._counting:
            counters.mark(op, formulas.dgl_cost(name, args, out) if formula else None)
        memory.made(out)  # its results, for memory (nothing while it is off)
        return out

    counts = not method or name in _DEGREES  # what runs in DGL's own library, unseen

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        count = counts and counters._mode is not None  # the counters', or memory's
        if not framework_steps.n or not recording():
            return counted(args, kwargs) if count else fn(*args, **kwargs)
        with st:
            return counted(args, kwargs) if count else fn(*args, **kwargs)

    wrapper._ic_wrapped = name  # type: ignore[attr-defined]
    skip_frame(wrapper)
    return wrapper if method else staticmethod(wrapper)


def marked(fn: Any, op: str) -> Any:
    """A kernel's backward that marks its call for the counters
    (see ``core.meters.counters.mark``)."""

    @functools.wraps(fn)
    def backward(*args: Any, **kwargs: Any) -> Any:
        counters.mark(op)
        return fn(*args, **kwargs)

    backward._ic_wrapped = op  # type: ignore[attr-defined]
    return staticmethod(skip_frame(backward))


def grad_in_backward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.autograd.grad`` as the step ``autograd.grad`` where a step's backward calls
    it (GroupRevRes's autograd Function differentiates its recomputed forward so, inside the
    layer's backward); everywhere else torch's own, after one thread-local read."""
    st = Step("autograd.grad")

    @functools.wraps(fn)
    def grad(*args: Any, **kwargs: Any) -> Any:
        entry = thread_stack()[-1].entry
        if entry is None or entry.phase != "backward" or not recording():
            return fn(*args, **kwargs)
        with st:
            return fn(*args, **kwargs)

    grad._ic_wrapped = "autograd.grad"  # type: ignore[attr-defined]
    return skip_frame(grad)
