"""Routing an upstream module's globals through steps while a layer of that module runs.

A forward calls functions such as ``add_self_loops`` or ``F.dropout`` through its module's
globals, looked up at call time: :class:`Routes` puts timing wrappers there for the length of
an instrumented call, then the originals back. :func:`scan` finds those calls in the
forward's bytecode.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import inspect
import threading
import types
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Tuple

from ...core.steps.step import Step

__all__ = [
    "Route",
    "Routes",
    "routes_of",
    "route_forward",
    "Vocabulary",
    "scan",
    "helpers",
    "handed",
    "torch_function",
    "any_function",
]

# -- what a forward calls, found in its bytecode ------------------------------------------


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


def _self_loads(fn: Callable[..., Any]) -> Iterator[Tuple[str, bool, List[Any]]]:
    """Each ``self.<name>`` that ``fn`` reads (nested code included): the name, whether it is
    read to be called as a method (3.11: LOAD_METHOD; 3.12+: LOAD_ATTR marked as a method
    load; not a bound method handed on as a value, as GroupRevRes's ``self._forward``), and
    the two instructions after the read."""
    code = getattr(fn, "__code__", None)
    codes = [code] if code is not None else []
    while codes:
        c = codes.pop()
        codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        ins = list(dis.get_instructions(c))
        for i, (op, nxt) in enumerate(zip(ins, ins[1:])):
            if op.opname not in ("LOAD_FAST", "LOAD_DEREF") or op.argval != "self":
                continue
            called = nxt.opname == "LOAD_METHOD" or (
                nxt.opname == "LOAD_ATTR" and "NULL|self" in (nxt.argrepr or "")
            )
            if called or nxt.opname == "LOAD_ATTR":
                yield nxt.argval, called, ins[i + 2 : i + 4]


def _own_method(stock: type, owners: List[type], name: str) -> bool:
    """Whether ``name`` is a function that one of ``owners`` (classes of ``stock``) defines."""
    owner = next((k for k in stock.__mro__ if name in k.__dict__), None)
    return owner in owners and isinstance(owner.__dict__[name], types.FunctionType)


def helpers(stock: type, fn: Callable[..., Any], base: Tuple[type, ...]) -> Tuple[str, ...]:
    """The methods of ``stock`` that ``fn`` (its ``forward``) calls on ``self`` and that the
    stock class or a parent of it defines, below the ``base`` classes (``torch.nn.Module``,
    PyG's ``MessagePassing``): ChebConv's ``__norm__``, SuperGATConv's
    ``negative_sampling``... and the attributes it calls that no class defines, held by the
    instance (DGL's ``self.activation``, ``self._activation``: a function given to the
    constructor), where the forward reads them only to call them or to test them (``is
    None``, truth): a step, at each call, only when the instance holds a callable (a child
    module is a step already). Each is timed as a step named after it, as children are."""
    out: List[str] = []
    owners = [k for k in stock.__mro__ if k not in base and k is not object]
    classes = {n for k in stock.__mro__ for n in k.__dict__}
    tested: Dict[str, bool] = {}  # attributes read as values: only tested (True) or used
    for name, called, after in _self_loads(fn):
        if not called:
            tested[name] = tested.get(name, True) and _tested(after)
        elif name not in _NOT_HELPERS and name not in out:
            if name not in classes or _own_method(stock, owners, name):
                out.append(name)
    return tuple(n for n in out if n in classes or tested.get(n, True))


def handed(stock: type, fn: Callable[..., Any], base: Tuple[type, ...]) -> Tuple[str, ...]:
    """The methods of ``stock`` (below ``base``, as :func:`helpers`) that ``fn`` reads from
    ``self`` as values, to hand on: GroupRevRes's ``self._forward``, given to an autograd
    Function that calls it in the forward and again in the backward."""
    owners = [k for k in stock.__mro__ if k not in base and k is not object]
    out: List[str] = []
    for name, called, after in _self_loads(fn):
        if not called and name not in out and not _tested(after):
            if _own_method(stock, owners, name):
                out.append(name)
    return tuple(out)


def _tested(after: List[dis.Instruction]) -> bool:
    """Whether a value just read is only tested: ``is None``, ``is not None``, truth."""
    if not after:
        return False
    first = after[0].opname
    if first.startswith("POP_JUMP") or first in ("JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP"):
        return True  # if self.act:, if self.act is None: (3.12: POP_JUMP_IF_NONE)
    return (
        first == "LOAD_CONST"
        and after[0].argval is None
        and len(after) > 1
        and after[1].opname in ("IS_OP", "COMPARE_OP")
    )


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


# -- routing ----------------------------------------------------------------------------


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


def _timed(
    current: Callable[[], Callable[..., Any]],
    st: Step,
    depth: _Depth,
    like: Callable[..., Any],
    inside: Optional[Callable[..., Any]] = None,
) -> Callable[..., Any]:
    """A wrapper calling ``current()`` (what the name holds now: a patch made after import
    is honoured), inside the step ``st`` on a thread inside a routed call (``inside`` in its
    place there, if given), as it is on any other thread. Named like ``like``."""

    def routed(*args: Any, **kwargs: Any) -> Any:
        if depth.n:
            with st:
                return (inside or current())(*args, **kwargs)
        return current()(*args, **kwargs)

    routed.__name__ = getattr(like, "__name__", "routed")
    routed.__qualname__ = getattr(like, "__qualname__", routed.__name__)
    routed.__doc__ = getattr(like, "__doc__", None)
    routed.__wrapped__ = like  # type: ignore[attr-defined]
    return routed


class _Standin(types.ModuleType):
    """A module seen through a layer's global (``F``, ``torch``) while routed: the routed
    attributes are its own; any other is read from the real module on first use and kept
    until the next routed call begins (:meth:`Routes.__enter__` empties it)."""


def _standin(real: types.ModuleType, wrapped: Dict[str, Any]) -> _Standin:
    mod = _Standin(real.__name__, getattr(real, "__doc__", None))
    base = dict(mod.__dict__, **wrapped)
    d = mod.__dict__

    def __getattr__(name: str) -> Any:  # PEP 562: not found in the stand-in itself
        value = getattr(real, name)
        d[name] = value
        return value

    base["__getattr__"] = __getattr__
    mod._ic_base = base  # type: ignore[attr-defined]
    d.update(base)
    return mod


def _refresh(mod: _Standin) -> None:
    """Forget what a stand-in read from its real module (it may have been rebound since)."""
    d = mod.__dict__
    if len(d) != len(mod._ic_base) + 1:  # + _ic_base itself
        base = mod._ic_base  # type: ignore[attr-defined]
        d.clear()
        d.update(base)
        d["_ic_base"] = base


class Routes:
    """Names of one module's namespace routed through steps while blocks run: one object per
    namespace (:func:`routes_of`), whatever classes of that module use it.

    :meth:`add` names what to route: functions (global names, each timed as a step named
    after it) and attributes of modules it imports (``{"F": ("dropout",)}``: the global
    ``F`` replaced by a stand-in whose ``dropout`` is timed). Use it as a context manager
    around a layer's call (re-entrant, thread-safe).

    A wrapper times only on a thread inside such a call, and always calls what the name held
    when the routed call began, so it computes what the stock code does. Outside the calls
    the namespace holds its own values again (TorchScript meets none of ours), but a name
    rebound by someone else during a routed call keeps that value, and a wrapper copied from
    the namespace during a call stays where it was copied.
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
                    self._values[name] = self._global(name, fn)
            for name, fn in (through or {}).items():
                if name in self._values and not isinstance(self._values[name], _Standin):
                    self._values[name] = self._global(name, ns[name], inside=fn)
            for name, attrs in (attributes or {}).items():
                real = ns.get(name)
                if not isinstance(real, types.ModuleType):
                    continue
                wrapped = self._attrs.setdefault(name, {})
                for a in attrs:
                    if a not in wrapped:
                        current = functools.partial(getattr, real, a)  # read at each call
                        wrapped[a] = _timed(current, Step(a), self._depth, getattr(real, a))
                if wrapped:
                    self._values[name] = _standin(real, wrapped)

    def _global(self, name: str, fn: Any, inside: Any = None) -> Callable[..., Any]:
        """The wrapper of the global ``name``: it calls what the name held when the routed
        call began (or ``fn``, its value now, outside one)."""
        saved = self._saved
        return _timed(lambda: saved.get(name, fn), Step(name), self._depth, fn, inside)

    def __bool__(self) -> bool:
        """Whether anything is routed."""
        return bool(self._values)

    def __enter__(self) -> "Routes":
        """Route the names (the first block in), and time them on this thread. A name the
        namespace no longer holds is left alone."""
        with self._lock:
            if not self._open:
                ns, saved = self.namespace, self._saved
                for name, value in self._values.items():
                    current = ns.get(name, _MISSING)
                    if current is _MISSING or current is value:
                        continue  # gone, or ours left by a generated module's copy
                    if type(value) is _Standin:
                        _refresh(value)
                    saved[name] = current
                    ns[name] = value
            self._open += 1
        self._depth.n += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        """Stop timing on this thread; the last block out puts the originals back, each
        only where the name still holds our wrapper (one rebound meanwhile stays so)."""
        self._depth.n -= 1
        with self._lock:
            self._open -= 1
            if not self._open:
                ns, values = self.namespace, self._values
                for name, original in self._saved.items():
                    if ns.get(name) is values[name]:
                        ns[name] = original
                self._saved.clear()


_MISSING = object()
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


#: What a framework routes (see :func:`.routes.scan`): its packages, per module name which of
#: its attributes, the names of functions timed otherwise (DGL's kernels), and the method
#: names of the framework's objects that are steps (``graph.update_all``; see :mod:`.forward`),
#: and the base classes whose methods are never a layer's own helpers (``helpers``).
Vocabulary = Tuple[
    Tuple[str, ...],
    Dict[str, Callable[[str], bool]],
    FrozenSet[str],
    FrozenSet[str],
    Tuple[type, ...],
]


def route_forward(stock: type, vocabulary: Vocabulary) -> Optional[Routes]:
    """The routes of ``stock.forward``'s module with what it calls added; None if none."""
    fn = inspect.unwrap(stock.forward)
    namespace = getattr(fn, "__globals__", None)
    if namespace is None:
        return None
    functions, attributes = scan(fn, namespace, *vocabulary[:3])
    if not functions and not attributes:
        return None
    routes = routes_of(namespace)
    routes.add(functions, attributes)
    return routes
