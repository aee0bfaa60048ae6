"""Generic instrumented layers: every conv class without a detailed version, no copied code.

A generic layer is a subclass of a stock conv class, made at import by :func:`make_class`
(``instrumented_convs.pyg.SAGEConv``, ``instrumented_convs.dgl.GATConv``...). It copies no
upstream code. Its ``forward`` is the stock ``forward`` inside the layer's own step (named
after the class, scoped per instance), and each call of a direct child module (``lin``,
``lin_l``, ``nn``, ``fc``...) inside it is a step named after the attribute, through a
``forward`` set on the child instance (items of a ``ModuleList`` or ``ModuleDict`` are
named ``convs.0``, ``convs.<key>``). The framework modules add the
framework's own steps (PyG: :mod:`._pyg_generic`; DGL: :mod:`._dgl_generic`).

While instrumentation is disabled, or while ``torch.compile`` traces the layer, ``forward``
runs the stock code and the children's ``forward`` return at their first check.
"""
from __future__ import annotations

import copy
import functools
import threading
from typing import Any, Callable, ClassVar, Dict, FrozenSet, Iterator, Optional, Tuple

import torch
from torch import Tensor

from ._layers import InstrumentedLayer, instance_scope
from ._step import Step, instrumenting, mark_outputs

__all__ = ["GenericLayer", "make_all", "make_class", "with_note", "inside", "device_of", "stock_copy", "detach"]


class _Inside(threading.local):
    """How many generic layers' forwards are running on this thread (framework steps gate on it)."""

    n = 0


#: Per-thread depth of running generic forwards: DGL's graph and kernel wrappers record a
#: step only while it is positive, so stock layers elsewhere record nothing.
inside = _Inside()


def device_of(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[torch.device]:
    """The device of a forward's first tensor (or graph) argument; None if it has none."""
    for a in (*args, *kwargs.values()):
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
        else:
            d = getattr(a, "device", None)  # a DGL graph; a SparseTensor's is a method
            if isinstance(d, torch.device):
                return d
    return None


class _TimedForward:
    """A child module's ``forward``, set on the instance: inside a generic layer's forward it
    runs the class's ``forward`` in a step named after the child's attribute.

    An instance attribute rather than module hooks: a module with forward hooks takes
    torch's slow call path even when the hooks do nothing (several microseconds per call, so
    a disabled layer would not run at stock speed), and a ``with`` block closes the step
    when the child raises.
    """

    __slots__ = ("module", "step")

    def __init__(self, module: torch.nn.Module, step: Step) -> None:
        """Time ``module``'s calls as ``step``."""
        self.module = module
        self.step = step

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The class's ``forward``, in the step while a generic forward runs on this thread."""
        m = self.module
        if not inside.n or not instrumenting():
            return type(m).forward(m, *args, **kwargs)
        with self.step:
            return type(m).forward(m, *args, **kwargs)


def _children(module: torch.nn.Module) -> Iterator[Tuple[str, torch.nn.Module]]:
    """Direct children by attribute name; items of ModuleList/ModuleDict as ``name.key``."""
    for name, child in module.named_children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            for key, item in child.named_children():
                yield f"{name}.{key}".replace("/", "|"), item
        else:
            yield name, child


def _timed(child: torch.nn.Module) -> bool:
    return isinstance(child.__dict__.get("forward"), _TimedForward)


def attach(layer: torch.nn.Module, skip: FrozenSet[str]) -> None:
    """Time every direct child of ``layer`` (not in ``skip``) as a step; idempotent."""
    for name, child in _children(layer):
        if name in skip or _timed(child) or "forward" in child.__dict__:
            continue  # (a forward set on the instance by someone else is left alone)
        child.__dict__["forward"] = _TimedForward(child, Step(name))


def detach(module: torch.nn.Module) -> None:
    """Remove our timing from every direct child of ``module`` (the reverse of :func:`attach`)."""
    for _, child in _children(module):
        if _timed(child):
            del child.__dict__["forward"]


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called")


def _shallow(m: torch.nn.Module, drop_ours: bool = False) -> torch.nn.Module:
    """A new module object sharing ``m``'s parameters, buffers and children, with its own
    dictionaries of them and of its forward hooks; our timing dropped (``drop_ours``) or
    bound to the new object."""
    c = copy.copy(m)
    for attr in ("_parameters", "_buffers", "_modules", *_HOOK_DICTS):
        d = m.__dict__.get(attr)
        if d is not None:
            c.__dict__[attr] = type(d)(d)
    timed = c.__dict__.get("forward")
    if isinstance(timed, _TimedForward):
        if drop_ours:
            del c.__dict__["forward"]
        else:
            c.__dict__["forward"] = _TimedForward(c, timed.step)
    return c


def _copy_children(layer: torch.nn.Module, drop_ours: bool) -> None:
    """Give ``layer`` shallow copies of its children (and of containers' items)."""
    for name, child in list(layer._modules.items()):
        if child is None:
            continue
        child = _shallow(child, drop_ours)
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            for key, item in list(child._modules.items()):
                if item is not None:
                    child._modules[key] = _shallow(item, drop_ours)
        layer._modules[name] = child


def stock_copy(layer: torch.nn.Module, stock: type) -> torch.nn.Module:
    """A stock-class copy of ``layer`` sharing its parameters, buffers and grandchildren;
    its children are shallow copies without our timing (TorchScript cannot compile it)."""
    out = _shallow(layer)
    out.__class__ = stock
    for attr in ("_ic_scope", "_ic_steps"):
        out.__dict__.pop(attr, None)
    _copy_children(out, drop_ours=True)
    return out


class GenericLayer(InstrumentedLayer):
    """Mixin of the generic layers: timed children from construction, stock copies for scripting."""

    #: Children not timed as steps (PyG's aggregation module runs inside ``aggregate``).
    _ic_skip: ClassVar[FrozenSet[str]] = frozenset({"aggr_module"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The stock constructor, arguments passed through unchanged; then the timed children."""
        super().__init__(*args, **kwargs)
        self._ic_after_init()

    def _ic_after_init(self) -> None:
        """Per-framework set-up after the stock constructor (and after :func:`convert`)."""
        attach(self, self._ic_skip)  # type: ignore[arg-type]

    def to_stock(self) -> Any:
        """A stock layer sharing this layer's parameters, buffers and grandchildren (untimed)."""
        return stock_copy(self, self._ic_stock)  # type: ignore[arg-type]

    @classmethod
    def from_stock(cls, layer: Any) -> Any:
        """An instrumented layer sharing the parameters, buffers and children of ``layer``."""
        if type(layer) is not cls._ic_stock:
            raise TypeError(f"{cls.__name__}.from_stock takes a {cls._ic_stock.__name__}, "
                            f"not a {type(layer).__name__}")
        out = _shallow(layer)
        _copy_children(out, drop_ours=False)  # timing goes on copies, not on ``layer``'s children
        return convert(out, cls)


def convert(layer: Any, cls: type) -> Any:
    """Turn ``layer`` (an instance of ``cls._ic_stock``) into a ``cls`` in place."""
    layer.__class__ = cls
    layer._ic_scope = instance_scope(cls._ic_stock.__name__)
    after = getattr(layer, "_ic_after_init", None)
    if after is not None:
        after()
    return layer


def _forward(stock: type) -> Callable[..., Any]:
    stock_forward = stock.forward

    @functools.wraps(stock_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not instrumenting():
            return stock_forward(self, *args, **kwargs)
        inside.n += 1
        try:
            with self._ic_step(device_of(args, kwargs)):
                return mark_outputs(stock_forward(self, *args, **kwargs))
        finally:
            inside.n -= 1

    forward.__doc__ = f"The stock ``{stock.__name__}.forward`` inside the layer's own step."
    return forward


def with_note(stock: type, note: str) -> str:
    """``stock``'s docstring (tools read it: PyG's cheatsheet finds the paper there) with a
    last paragraph saying what the instrumented class is."""
    return f"{(stock.__doc__ or '').rstrip()}\n\n    ``instrumented_convs``: {note}.\n"


def make_all(conv: Any, module: str, mixin: type, detailed: frozenset, not_instrumented: Dict[str, str],
             namespace: Callable[[type], Dict[str, Any]] = lambda stock: {}) -> Dict[str, type]:
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
        made[name] = make_class(stock, module, mixin, namespace(stock))
    return made


def make_class(stock: type, module: str, mixin: type, namespace: Optional[Dict[str, Any]] = None) -> type:
    """The generic instrumented subclass of ``stock``, living in ``module`` under its name."""
    ns: Dict[str, Any] = {
        "__module__": module,
        "__qualname__": stock.__name__,
        "__doc__": with_note(stock, "a generic instrumented layer: its steps are timed, no "
                                    "upstream code is copied"),
        "_ic_stock": stock,
        "forward": _forward(stock),
    }
    ns.update(namespace or {})
    return type(stock.__name__, (mixin, stock), ns)
