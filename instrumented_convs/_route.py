"""Routing an upstream module's globals through steps while a layer of that module runs.

Code in a layer's ``forward`` that is neither a child module nor a message-passing method
(PyG's ``add_self_loops``, ``softmax``, ``gcn_norm``; ``F.dropout``, ``torch.cat``; DGL's
``th.pow`` of the degree normalisation...) would run in the layer's own time, in no named
step. It calls those functions through its module's globals, looked up at call time, so
for the length of an instrumented call they can be routed: :class:`Routes` puts a wrapper
in the module's namespace (for ``F.dropout``, a stand-in module for ``F`` whose
``dropout`` is one) and the last call out puts the originals back. A wrapper times its
function as a step (named after it) only on a thread that is inside such a call, so a stock
layer running on another thread meanwhile runs untimed, with one thread-local read more; no
wrapper is ever seen outside the calls (TorchScript, which reads a module's globals when it
compiles a stock layer, never meets one). :func:`scan` finds what a forward calls so.

:class:`Route` is the one-function form with a handler of its own (the detailed GCNConv's
fallback routes upstream's ``gcn_norm`` through ours). Nothing here imports from the package
but :mod:`._step`.
"""

from __future__ import annotations

import contextlib
import dis
import threading
import types
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Tuple

from ._step import Step

__all__ = ["Route", "Routes", "routes_of", "scan", "helpers", "torch_function", "any_function"]


class Route:
    """``module.name`` routed through ``inside(original, *args, **kwargs)`` within blocks."""

    def __init__(self, module: Any, name: str, inside: Callable[..., Any]) -> None:
        """A route for ``module.name``, inactive until :meth:`active`."""
        self.module, self.name, self.inside = module, name, inside
        self._lock = threading.Lock()
        self._open: List[Any] = []  # [the original, then one None per open block]
        self._tls = threading.local()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """What the module's global is while routed."""
        original = self._open[0] if self._open else getattr(self.module, self.name)
        if getattr(self._tls, "depth", 0):
            return self.inside(original, *args, **kwargs)
        return original(*args, **kwargs)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the global while the block runs (on this thread: through ``inside``)."""
        with self._lock:
            if not self._open:
                self._open.append(getattr(self.module, self.name))
                setattr(self.module, self.name, self)
            self._open.append(None)
        self._tls.depth = getattr(self._tls, "depth", 0) + 1
        try:
            yield
        finally:
            self._tls.depth -= 1
            with self._lock:
                self._open.pop()
                if len(self._open) == 1:
                    setattr(self.module, self.name, self._open.pop())


class _Depth(threading.local):
    """How many routed calls are open on this thread."""

    n = 0


def _timed(fn: Callable[..., Any], st: Step, depth: _Depth) -> Callable[..., Any]:
    """``fn`` in the step ``st`` on a thread inside a routed call; else ``fn`` as it is."""

    def routed(*args: Any, **kwargs: Any) -> Any:
        if depth.n:
            with st:
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    routed.__name__ = getattr(fn, "__name__", "routed")
    routed.__qualname__ = getattr(fn, "__qualname__", routed.__name__)
    routed.__doc__ = getattr(fn, "__doc__", None)
    routed.__wrapped__ = fn  # type: ignore[attr-defined]
    return routed


class _Standin(types.ModuleType):
    """A module seen through a layer's global (``F``, ``torch``) while routed: the routed
    attributes are its own, every other attribute is read from the real module."""


def _standin(real: types.ModuleType, wrapped: Dict[str, Any]) -> _Standin:
    mod = _Standin(real.__name__, getattr(real, "__doc__", None))
    mod.__dict__.update(wrapped)
    mod.__dict__["__getattr__"] = lambda name: getattr(real, name)  # PEP 562
    return mod


class Routes:
    """Names of one module's namespace routed through steps while blocks run: one object per
    namespace (:func:`routes_of`), whatever classes of that module use it.

    :meth:`add` names what to route: functions (global names, each timed as a step named
    after it) and attributes of modules it imports (``{"F": ("dropout",)}``: the global
    ``F`` replaced by a stand-in whose ``dropout`` is timed). Use it as a context manager
    around a layer's call (re-entrant, thread-safe).
    """

    __slots__ = ("namespace", "_values", "_lock", "_open", "_saved", "_depth", "_attrs")

    def __init__(self, namespace: Dict[str, Any]) -> None:
        """Routes for ``namespace`` (a module's ``__dict__``), routing nothing yet."""
        self.namespace = namespace
        self._depth = _Depth()
        self._values: Dict[str, Any] = {}
        self._attrs: Dict[str, Dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._open = 0
        self._saved: Dict[str, Any] = {}

    @property
    def names(self) -> FrozenSet[str]:
        """The global names routed."""
        return frozenset(self._values)

    @property
    def timed(self) -> FrozenSet[str]:
        """What the routes time, as code names it: ``add_self_loops``, ``F.dropout``."""
        attrs = {f"{m}.{a}" for m, wrapped in self._attrs.items() for a in wrapped}
        return frozenset(n for n in self._values if n not in self._attrs) | attrs

    def add(
        self,
        functions: Tuple[str, ...] = (),
        attributes: Any = None,
        through: Optional[Dict[str, Callable[..., Any]]] = None,
    ) -> None:
        """Route these too (see the class); names already routed are kept as they are, but
        ``through``: ``{global name: function}`` routes that name through the step to that
        function instead of the namespace's (an instrumented copy with steps of its own that
        computes the same: the detailed ``gcn_norm``)."""
        with self._lock:
            if self._open:
                raise RuntimeError("routes cannot change while a routed call runs")
            ns = self.namespace
            for name in functions:
                fn = ns.get(name)
                if name not in self._values and callable(fn):
                    self._values[name] = _timed(fn, Step(name), self._depth)
            for name, fn in (through or {}).items():
                if name in self._values and not isinstance(self._values[name], _Standin):
                    self._values[name] = _timed(fn, Step(name), self._depth)
            for name, attrs in (attributes or {}).items():
                real = ns.get(name)
                if not isinstance(real, types.ModuleType):
                    continue
                wrapped = self._attrs.setdefault(name, {})
                for a in attrs:
                    if a not in wrapped:
                        wrapped[a] = _timed(getattr(real, a), Step(a), self._depth)
                if wrapped:
                    self._values[name] = _standin(real, wrapped)

    def __bool__(self) -> bool:
        """Whether anything is routed."""
        return bool(self._values)

    def __enter__(self) -> "Routes":
        """Route the names (the first block in), and time them on this thread."""
        with self._lock:
            if not self._open:
                ns = self.namespace
                for name, value in self._values.items():
                    self._saved[name] = ns[name]
                    ns[name] = value
            self._open += 1
        self._depth.n += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        """Stop timing on this thread; the last block out puts the originals back."""
        self._depth.n -= 1
        with self._lock:
            self._open -= 1
            if not self._open:
                self.namespace.update(self._saved)
                self._saved.clear()


_ROUTES: Dict[int, Routes] = {}
_ROUTES_LOCK = threading.Lock()


def routes_of(namespace: Dict[str, Any]) -> Routes:
    """The one :class:`Routes` of a module namespace (two would save each other's wrappers
    as the originals)."""
    with _ROUTES_LOCK:
        r = _ROUTES.get(id(namespace))
        if r is None or r.namespace is not namespace:
            r = _ROUTES[id(namespace)] = Routes(namespace)
        return r


#: Predicates, checks and helpers that do no work worth a step (name prefixes).
_CHEAP = ("is_", "check_", "maybe_", "_", "expand_as_pair", "dgl_warning", "warn")

#: Functions of ``torch`` that are not worth a step: views and reshapes (no data moves),
#: tensors from Python data or filled with a constant, grad modes, types and devices.
_TORCH_CHEAP = frozenset(
    "reshape view flatten unflatten squeeze unsqueeze transpose permute t narrow chunk split "
    "tensor_split unbind movedim select expand broadcast_to as_strided tensor as_tensor "
    "from_numpy no_grad enable_grad inference_mode device finfo iinfo numel jit ops "
    "empty empty_like get_default_dtype set_grad_enabled is_grad_enabled arange zeros ones "
    "zeros_like ones_like full full_like".split()
)


def torch_function(name: str) -> bool:
    """Whether a function ``torch.<name>`` that a forward calls is worth a step of its own."""
    return name not in _TORCH_CHEAP and not name.startswith(_CHEAP)


def any_function(name: str) -> bool:
    """Whether a function of a module (``F.<name>``) is worth a step: all but helpers."""
    return not name.startswith(_CHEAP)


#: Methods a layer's forward may call on itself that are never its own steps.
_NOT_HELPERS = frozenset({"forward", "__call__", "_call_impl", "_wrapped_call_impl"})


def helpers(stock: type, fn: Callable[..., Any], base: Tuple[type, ...]) -> Tuple[str, ...]:
    """The methods of ``stock`` that ``fn`` (its ``forward``) calls on ``self`` and that the
    stock class or a parent of it defines, below the ``base`` classes (``torch.nn.Module``,
    PyG's ``MessagePassing``): ChebConv's ``__norm__``, SuperGATConv's
    ``negative_sampling``... Each is timed as a step named after it, as children are."""
    out: List[str] = []
    owners = [k for k in stock.__mro__ if k not in base and k is not object]
    code = getattr(fn, "__code__", None)
    codes = [code] if code is not None else []
    while codes:
        c = codes.pop()
        codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        ins = list(dis.get_instructions(c))
        for op, nxt in zip(ins, ins[1:]):
            if op.opname not in ("LOAD_FAST", "LOAD_DEREF") or op.argval != "self":
                continue
            if nxt.opname not in ("LOAD_METHOD", "LOAD_ATTR"):
                continue
            name = nxt.argval
            if name in _NOT_HELPERS or name in out:
                continue
            owner = next((k for k in stock.__mro__ if name in k.__dict__), None)
            if owner in owners and isinstance(owner.__dict__[name], types.FunctionType):
                out.append(name)
    return tuple(out)


def scan(
    fn: Callable[..., Any],
    namespace: Dict[str, Any],
    packages: Tuple[str, ...],
    modules: Dict[str, Callable[[str], bool]],
    skip: FrozenSet[str] = frozenset(),
) -> Tuple[Tuple[str, ...], Dict[str, Tuple[str, ...]]]:
    """What ``fn`` (a ``forward``) calls through ``namespace`` that :class:`Routes` can time.

    Functions: globals that are functions of ``packages`` (``("torch_geometric",)``), but
    cheap predicates and helpers and the names in ``skip`` (timed otherwise). Attributes:
    for a global that is a module named in ``modules`` (by its real name,
    ``"torch.nn.functional"``), the functions the code reads of it that
    ``modules[name](attribute)`` accepts. Nested code (comprehensions) included.
    """
    functions: List[str] = []
    attributes: Dict[str, List[str]] = {}
    codes = [getattr(fn, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        ins = list(dis.get_instructions(code))
        for i, op in enumerate(ins):
            if op.opname != "LOAD_GLOBAL":
                continue
            name = op.argval
            value = namespace.get(name)
            if isinstance(value, types.ModuleType):
                accept = modules.get(value.__name__)
                nxt = ins[i + 1] if i + 1 < len(ins) else None
                if accept and nxt is not None and nxt.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                    attr = nxt.argval
                    v = getattr(value, attr, None)
                    if callable(v) and not isinstance(v, type) and accept(attr):
                        attributes.setdefault(name, [])
                        if attr not in attributes[name]:
                            attributes[name].append(attr)
            elif isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
                owner = getattr(value, "__module__", None) or ""
                if (
                    owner.split(".")[0] in packages
                    and not name.startswith(_CHEAP)
                    and name not in skip
                ):
                    if name not in functions:
                        functions.append(name)
    return tuple(functions), {k: tuple(v) for k, v in attributes.items()}
