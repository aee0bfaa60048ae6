"""Generic instrumented layers: every conv class without a detailed version, made at import by
:func:`make_class`, a subclass that copies no upstream code and overrides only ``forward``.

That runs the stock forward in the layer's step, its children, methods and helpers timed for
that call only (:func:`install`); outside it, every call is the stock code, with no extra
frame or check.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, ClassVar, Dict, FrozenSet, List, Optional, Tuple

import torch
from torch import Tensor

from ..core.compiler.dynamo import compiling, inside_compiled, skip_frame, traced
from ..core.native import speedups
from ..core.settings import switches
from ..core.steps.step import Step, mark_outputs, recording, relate
from .contract import Handed, InstrumentedLayer, Timed, _name
from .relations import child_names, holder_attribute
from .statements.forward import Own
from .statements.routes import Routes, Vocabulary, handed, helpers, route_forward

__all__ = [
    "GenericLayer",
    "make_all",
    "make_class",
    "with_note",
    "framework_steps",
    "device_of",
    "install",
    "uninstall",
    "runs_stock",
]


@skip_frame  # called eagerly after a graph break, as the forwards that call it are
def runs_stock(layer: Any) -> bool:
    """Whether a drop-in layer's ``forward`` runs the stock code as it is: nothing records, or
    it runs inside a compiled call (where Dynamo compiled the stock code, it runs as Dynamo saw
    it). While Dynamo traces the layer, notes it as traced
    (:func:`~instrumented_convs.core.compiler.dynamo.traced`)."""
    if recording() and not inside_compiled():
        return False
    if compiling():  # torch.compile traces this forward: noted at trace time
        traced(layer)
    return True


class _Depth(threading.local):
    """How many generic layers' forwards are running on this thread."""

    n = 0


#: Where the framework's own calls are steps: the per-thread depth of running generic forwards.
#: DGL's graph and kernel wrappers record a step only while it is positive (and
#: :func:`~instrumented_convs.core.steps.step.recording`), so stock layers elsewhere
#: record nothing; the detailed DGL layers set it to 0 while they run, since their copies
#: time those calls themselves.
framework_steps = _Depth()


def device_of(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[torch.device]:
    """The device of a forward's first tensor argument (also in a tuple, list or dict); else
    of its first argument with a ``device`` (a DGL graph, whose ``device`` costs DGL several
    Python calls, so tensors are looked at first); None if it has neither."""
    values = (*args, *kwargs.values())
    for a in values:
        if isinstance(a, Tensor):
            return a.device
        if isinstance(a, (tuple, list)):
            for b in a:
                if isinstance(b, Tensor):
                    return b.device
        elif isinstance(a, dict):
            for b in a.values():
                if isinstance(b, Tensor):
                    return b.device
    for a in values:
        if not isinstance(a, (Tensor, tuple, list, dict)):
            d = getattr(a, "device", None)  # a DGL graph; a SparseTensor's is a method
            if isinstance(d, torch.device):
                return d
    return None


_ABSENT = object()
#: What :func:`install` changed: (the instance dict, the name, the value before or None).
Undo = List[Tuple[Dict[str, Any], str, Any]]


def _timed_method(
    d: Dict[str, Any], owner: Any, name: str, st: Step, undo: Undo, kind: Any = None
) -> None:
    """Time ``owner.name`` (``d`` is ``owner.__dict__``) with a :data:`Timed` (or ``kind``:
    :class:`Handed`) until :func:`uninstall`: the class's method, or a callable the instance
    holds (an activation; PyG's explain mode, a user's); not None, nor one timed already."""
    cur = d.get(name, _ABSENT)
    if cur is _ABSENT:
        fn = getattr(type(owner), name, None)
        if fn is None:
            return
        cur, fn = None, fn.__get__(owner)
    elif cur is None or type(cur) in (Timed, Handed) or not callable(cur):
        return  # (timed already: the same layer called inside its own forward)
    else:
        fn = cur
    d[name] = (kind or Timed)(fn, st)
    undo.append((d, name, cur))


def install(layer: Any, children: bool = True, methods: Any = None) -> Undo:
    """Time ``layer``'s methods that its class names (``_ic_methods``: (name, step) pairs, or
    ``methods``) and, with ``children``, its direct children, until :func:`uninstall` gets
    the returned list."""
    undo: Undo = []
    methods = type(layer)._ic_methods if methods is None else methods
    for name, st in getattr(type(layer), "_ic_handed", ()):  # (rare: GroupRevRes)
        _timed_method(layer.__dict__, layer, name, st, undo, Handed)
    if speedups is not None:  # the same, in C
        speedups.time_methods(layer, methods, undo)
        if children:
            speedups.time_children(_timed_children(layer), undo)
        return undo
    d = layer.__dict__
    for name, st in methods:
        _timed_method(d, layer, name, st, undo)
    if children:
        for child, st in _timed_children(layer):
            _timed_method(child.__dict__, child, "forward", st, undo)
    return undo


def uninstall(undo: Undo) -> None:
    """Put back what :func:`install` changed (latest first)."""
    if speedups is not None:
        speedups.restore(undo)
        return
    for d, name, cur in reversed(undo):
        if cur is None:
            d.pop(name, None)
        else:
            d[name] = cur


def _timed_children(layer: Any) -> List[Tuple[torch.nn.Module, Step]]:
    """``layer``'s direct children with their steps, cached on the instance while its children
    stay the same objects (the cache is keyed by ``id(layer)``: a copy builds its own). A
    child that computes a relation (``HeteroConv``'s, ``HeteroGraphConv``'s) is a step of that
    relation in a scope of its own: the child's (an instrumented layer's, while it keeps it),
    else ``<layer's scope>.<name>``."""
    d = layer.__dict__
    modules = tuple(layer._modules.values())
    cached = d.get("_ic_children")
    if (
        cached is not None
        and cached[0] == id(layer)
        and cached[1] == modules
        and (not cached[3] or all(c.__dict__.get("_ic_scope") == s for c, s in cached[3]))
    ):
        return cached[2]
    skip = layer._ic_skip
    kids, named = [], []
    for name, child, relation in child_names(layer):
        name = name.replace("/", "|")
        if name in skip:
            continue
        if relation is None:
            kids.append((child, Step(name)))
            continue
        if isinstance(child, InstrumentedLayer):
            scope = child.scope
            named.append((child, scope))
        else:
            scope = f"{layer.scope}.{name}"
        relate(scope, relation)
        kids.append((child, Step(name, scope)))
    d["_ic_children"] = (id(layer), modules, kids, named)
    return kids


class GenericLayer(InstrumentedLayer):
    """Mixin of the generic layers: the stock forward in a step, children and named methods
    timed during it (:func:`install`)."""

    #: Children not timed as steps (PyG's aggregation module runs inside ``aggregate``).
    _ic_skip: ClassVar[FrozenSet[str]] = frozenset({"aggr_module"})

    def _ic_after_init(self) -> None:
        """A layer that holds a module per relation (``HeteroConv``) names its instrumented
        children after their relation, below its own scope, unless named already."""
        super()._ic_after_init()
        if holder_attribute(self) is not None:
            _name(self, self.scope, keep=True, provisional=True)


_NOTHING = contextlib.nullcontext()


def _forward(stock: type, routes: Optional[Routes], own: Optional[Own]) -> Any:
    """The generic layer's ``forward``: the stock one (or the same code with its own
    statements in steps, :class:`.statements.forward.Own`) in the layer's step, with ``routes``
    in place (both unless ``configure(statements=False)``)."""
    stock_forward = stock.forward
    if own is None:
        own = Own(stock, frozenset(), frozenset())
        own.fn = stock_forward
    calls = routes or _NOTHING

    @functools.wraps(stock_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if runs_stock(self):
            return stock_forward(self, *args, **kwargs)
        if switches.advise and self._ic_advise is not None:
            self._ic_advise(self, args, kwargs)
        if switches.statements:
            run, ctx = own.fn or own.resolve(), calls
        else:
            run, ctx = stock_forward, _NOTHING
        undo = install(self)
        framework_steps.n += 1
        try:
            with ctx, self._ic_step(device_of(args, kwargs)):  # (routing: not in the step)
                return mark_outputs(run(self, *args, **kwargs))
        finally:
            framework_steps.n -= 1
            uninstall(undo)

    forward.__doc__ = f"The stock ``{stock.__name__}.forward`` inside the layer's own step."
    return skip_frame(forward)  # called after a graph break: Dynamo compiles the stock frame


def with_note(stock: type, note: str) -> str:
    """``stock``'s docstring (tools read it: PyG's cheatsheet finds the paper there) with a
    last paragraph saying what the instrumented class is."""
    return f"{(stock.__doc__ or '').rstrip()}\n\n    ``instrumented_convs``: {note}.\n"


def make_all(
    conv: Any,
    module: str,
    mixin: type,
    detailed: frozenset,
    not_instrumented: Dict[str, str],
    namespace: Callable[[type], Dict[str, Any]] = lambda stock: {},
    vocabulary: Optional[Vocabulary] = None,
) -> Dict[str, type]:
    """A generic class (:func:`make_class`) for every class of ``conv.__all__`` (a framework's
    conv module) not in ``detailed`` or ``not_instrumented``; non-modules are added there."""
    made: Dict[str, type] = {}
    for name in conv.__all__:
        if name in detailed or name in not_instrumented:
            continue
        stock = getattr(conv, name, None)
        if not (isinstance(stock, type) and issubclass(stock, torch.nn.Module)):
            not_instrumented[name] = "not a torch.nn.Module class"
            continue
        made[name] = make_class(stock, module, mixin, namespace(stock), vocabulary)
    return made


def make_class(
    stock: type,
    module: str,
    mixin: type,
    namespace: Optional[Dict[str, Any]] = None,
    vocabulary: Optional[Vocabulary] = None,
) -> type:
    """The generic instrumented subclass of ``stock``, living in ``module`` under its name;
    the functions its ``forward`` calls that ``vocabulary`` names are routed through steps
    during its calls (:mod:`~instrumented_convs.layers.statements.routes`)."""
    routes = route_forward(stock, vocabulary) if vocabulary is not None else None
    own = None
    if vocabulary is not None:
        own = Own(stock, (routes.timed if routes else frozenset()) | vocabulary[2], vocabulary[3])
    ns: Dict[str, Any] = {
        "__module__": module,
        "__qualname__": stock.__name__,
        "__doc__": with_note(
            stock, "a generic instrumented layer: its steps are timed, no upstream code is copied"
        ),
        "_ic_stock": stock,
        "_ic_routes": routes,
        "_ic_own": own,
        "forward": _forward(stock, routes, own),
    }
    ns.update(namespace or {})
    if vocabulary is not None:  # the stock class's own helper methods, timed as steps too
        timed = {name for name, _ in ns.get("_ic_methods", ())}
        fn = inspect.unwrap(stock.forward)
        extra = [m for m in helpers(stock, fn, vocabulary[4]) if m not in timed]
        ns["_ic_methods"] = tuple(ns.get("_ic_methods", ())) + tuple((m, Step(m)) for m in extra)
        ns["_ic_handed"] = tuple((m, Step(m)) for m in handed(stock, fn, vocabulary[4]))
    return type(stock.__name__, (mixin, stock), ns)
