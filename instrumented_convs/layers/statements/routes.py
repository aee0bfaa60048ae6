"""Routing an upstream module's globals through steps while a layer of that module runs.

Code in a layer's ``forward`` that is neither a child module nor a message-passing method
(PyG's ``add_self_loops``, ``softmax``, ``gcn_norm``; ``F.dropout``, ``torch.cat``; DGL's
``th.pow`` of the degree normalisation...) would run in the layer's own time, in no named
step. It calls those functions through its module's globals, looked up at call time, so
for the length of an instrumented call they can be routed: :class:`Routes` puts a wrapper
in the module's namespace (for ``F.dropout``, a stand-in module for ``F`` whose
``dropout`` is one) and the last call out puts the originals back. A wrapper times its
function as a step (named after it) only on a thread that is inside such a call, so a stock
layer running on another thread meanwhile runs untimed, with one thread-local read more. A
wrapper always calls what the name held when the routed call began (a patch made after
import is honoured; ``F.<name>`` is read from ``F`` at each call), so it computes what the
stock code computes wherever it is seen. Outside the calls the namespace holds its own
values again (TorchScript, which reads a module's globals when it compiles a stock layer,
meets none of ours), but for two cases, both made harmless by the above: a name rebound
by someone else during a routed call keeps that value, and a wrapper read from the
namespace during a call (another thread's ``mock.patch`` saving it, PyG generating a
class's code with ``from module import *``) stays where it was copied. :mod:`._scan` finds
what a forward calls so.

:class:`Route` is the one-function form with a handler of its own (the detailed GCNConv's
fallback routes upstream's ``gcn_norm`` through ours). :func:`route_forward` makes a layer
class's routes. Nothing here imports from the package but :mod:`._step` and :mod:`._scan`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Tuple

from ...core.step import Step
from .calls import scan

__all__ = ["Route", "Routes", "routes_of", "route_forward", "Vocabulary"]


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


#: What a framework routes (see :func:`._scan.scan`): its packages, per module name which of
#: its attributes, the names of functions timed otherwise (DGL's kernels), and the method
#: names of the framework's objects that are steps (``graph.update_all``; see :mod:`._own`),
#: and the base classes whose methods are never a layer's own helpers (``_scan.helpers``).
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
