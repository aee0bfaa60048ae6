"""The contract every instrumented layer follows (:class:`InstrumentedLayer`), and naming layers
after the model's attributes (:func:`name_layers`).

An instrumented class adds no state to the stock one but its scope, so converting a layer
either way is swapping its class (:func:`convert`, :func:`revert`): in place, or on a shallow
copy sharing parameters and buffers.
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
from typing import Any, Callable, ClassVar, Dict, Iterator, Optional, Tuple, TypeVar

import torch

from ..core.native import speedups
from ..core.steps.step import Step, recording, relate
from .relations import walk

__all__ = [
    "InstrumentedLayer",
    "instance_scope",
    "name_layers",
    "is_default_scope",
    "convert",
    "revert",
    "Timed",
    "PyTimed",
    "Handed",
]

logger = logging.getLogger(__name__)

_counters: Dict[str, Iterator[int]] = {}
_lock = threading.Lock()

L = TypeVar("L", bound="InstrumentedLayer")


class PyTimed:
    """A bound callable run inside a step: set in an instance's ``__dict__`` for the length of
    one instrumented forward (see ``generic.install``), so it needs no check of its own. (The C
    extension has the same type, without a Python frame per call: :data:`Timed`.)"""

    __slots__ = ("fn", "step")

    def __init__(self, fn: Callable[..., Any], step: Step) -> None:
        """Call ``fn`` (a bound method, or a callable found on the instance) inside ``step``."""
        self.fn = fn
        self.step = step

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` inside the step."""
        with self.step:
            return self.fn(*args, **kwargs)


#: The type of timed callables: the C one when the extension is in use, else :class:`PyTimed`.
Timed: Any = speedups.Timed if speedups is not None else PyTimed


class Handed:
    """A method of the layer that its forward hands on as a value (GroupRevRes gives
    ``self._forward`` and ``self._inverse`` to an autograd Function, which calls them in the
    forward and again in the backward, to recompute): a step named after it wherever it is
    called while steps record (in the backward, under the layer's backward row); the plain
    method otherwise. Set in the instance's ``__dict__`` for the length of one instrumented
    forward, as :data:`Timed` is."""

    __slots__ = ("fn", "step")

    def __init__(self, fn: Callable[..., Any], step: Step) -> None:
        """Call ``fn`` (the bound method) inside ``step`` while steps record."""
        self.fn = fn
        self.step = step

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, inside the step while :func:`.recording`."""
        if not recording():
            return self.fn(*args, **kwargs)
        with self.step:
            return self.fn(*args, **kwargs)


def instance_scope(kind: str) -> str:
    """A fresh default scope for a layer instance: ``GCNConv#0``, ``GCNConv#1``, ..."""
    with _lock:
        counter = _counters.setdefault(kind, itertools.count())
        return f"{kind}#{next(counter)}"


class InstrumentedLayer:
    """Mixin of every instrumented layer: first in the bases, before the stock class.

    An instrumented layer looks like this::

        class GCNConv(InstrumentedLayer, torch_geometric.nn.GCNConv):
            _ic_stock = torch_geometric.nn.GCNConv      # the stock class

            def forward(self, ...):
                if not recording():
                    return super().forward(...)         # the stock code, nothing else
                with self._ic_step(device):             # the layer's own step
                    ...
    """

    #: The stock class this layer instruments.
    _ic_stock: ClassVar[type]
    #: Methods of the layer timed as steps during its instrumented forward: (name, Step)
    #: pairs (see ``generic.install``); none by default.
    _ic_methods: ClassVar[Tuple[Tuple[str, Step], ...]] = ()
    #: Methods the forward hands on as values, timed wherever they run (:class:`Handed`).
    _ic_handed: ClassVar[Tuple[Tuple[str, Step], ...]] = ()
    #: The kind of the layer's own step: ``step``, or ``upstream`` where a detailed layer runs
    #: upstream's own forward because the installed release differs from its copy (the table
    #: marks such rows: their parts are timed from outside).
    _ic_kind: ClassVar[str] = "step"
    #: What the forward calls, with the layer and its arguments, while the advice's signals
    #: are noted (``configure(advise=True)``; a framework's, for the classes it knows).
    _ic_advise: ClassVar[Optional[Callable[[Any, tuple, dict], None]]] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The stock constructor, arguments passed through unchanged; then a default scope
        and the class's own set-up (:meth:`_ic_after_init`)."""
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._ic_scope = instance_scope(self._ic_stock.__name__)
        self._ic_after_init()

    def _ic_after_init(self) -> None:
        """Per-class set-up after the stock constructor and after :func:`convert`."""

    @staticmethod
    def _ic_after_revert(layer: Any) -> None:
        """Per-class set-up of ``layer`` once :func:`revert` made it a stock layer again."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give the subclass the stock constructor's signature (for ``help`` and ``inspect``)."""
        super().__init_subclass__(**kwargs)
        import inspect

        stock = cls.__dict__.get("_ic_stock")
        if stock is not None:
            try:
                cls.__signature__ = inspect.signature(stock)  # type: ignore[attr-defined]
            except (TypeError, ValueError):  # pragma: no cover - a stock class without one
                pass

    @property
    def scope(self) -> str:
        """The layer instance's name in ``summary(by="layer")`` (``GCNConv#0`` or its path)."""
        return self._ic_scope

    @scope.setter
    def scope(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a layer scope is a non-empty string, not {name!r}")
        relation = self.__dict__.get("_ic_relation")  # (the old scope's is kept: a copy
        self._ic_scope = name  # of this layer may have it still)
        self.__dict__.pop("_ic_provisional", None)
        self.__dict__.pop("_ic_steps", None)
        self.__dict__.pop("_ic_children", None)  # (children's steps may carry the scope)
        if relation is not None:
            relate(name, relation)

    @property
    def relation(self) -> Optional[str]:
        """The relation of a heterogeneous model this layer computes (an edge type spelled
        ``author__writes__paper``), or None; ``summary(by="relation")`` groups by it."""
        return self.__dict__.get("_ic_relation")

    @relation.setter
    def relation(self, relation: Optional[str]) -> None:
        if relation is not None and (not isinstance(relation, str) or not relation):
            raise ValueError(f"a relation is a non-empty string or None, not {relation!r}")
        self.__dict__["_ic_relation"] = relation
        relate(self._ic_scope, relation)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """Unpickled (``torch.load`` of a model): the layer's relation said again."""
        super().__setstate__(state)  # type: ignore[misc]
        relation = self.__dict__.get("_ic_relation")
        if relation is not None:
            relate(self._ic_scope, relation)

    def _ic_step(self, device: torch.device) -> Step:
        """The layer's own top-level step for ``device``, built once per (scope, device)."""
        cache = self.__dict__.get("_ic_steps")
        if cache is None:
            cache = self.__dict__["_ic_steps"] = {}
        key = (self._ic_scope, device)
        s = cache.get(key)
        if s is None:
            name, scope = self._ic_stock.__name__, self._ic_scope
            s = cache[key] = Step(name, scope, device, self._ic_kind)
        return s

    def to_stock(self) -> Any:
        """A stock layer sharing this layer's parameters, buffers and grandchildren (its
        children are shallow copies) and train/eval mode; it records nothing."""
        out = _shallow(self)
        _copy_children(out)
        return revert(out)

    @classmethod
    def from_stock(cls: "type[L]", layer: Any) -> L:
        """An instrumented layer sharing the parameters, buffers and grandchildren of the
        stock ``layer`` (its children are shallow copies)."""
        if type(layer) is not cls._ic_stock:
            raise TypeError(
                f"{cls.__name__}.from_stock takes a {cls._ic_stock.__name__}, "
                f"not a {type(layer).__name__}"
            )
        out = _shallow(layer)
        _copy_children(out)
        return convert(out, cls)

    def __prepare_scriptable__(self) -> Any:
        """``torch.jit.script`` compiles the stock layer (sharing parameters) instead.

        TorchScript cannot compile the instrumentation, so a scripted model runs the stock
        code and records no steps; a warning says so. torch writes the copy returned here
        into the model being scripted, in place of this layer; the copy keeps this layer
        alive (``_ic_scripted_from``): torch tells modules apart by ``id`` while it
        prepares them, and a layer freed meanwhile would lend its ``id`` to a new copy,
        which torch would then mistake for it. ``instrument(model)`` puts the layers back.
        """
        stock = self._ic_stock
        logger.warning(
            "torch.jit.script: %s.%s is replaced by the stock %s.%s (same parameters); the "
            "scripted model records no steps, and torch leaves the stock copy in the model "
            "itself too: instrument(model) puts the instrumented layer back",
            type(self).__module__,
            type(self).__name__,
            stock.__module__,
            stock.__name__,
        )
        copy_ = self.to_stock()
        copy_.__dict__["_ic_scripted_from"] = (self,)
        return copy_


def convert(layer: Any, cls: "type[L]") -> L:
    """Make ``layer`` (a ``cls._ic_stock``) a ``cls`` in place: the same object, parameters,
    buffers and ``state_dict``; a fresh default scope."""
    layer.__class__ = cls
    layer._ic_scope = instance_scope(cls._ic_stock.__name__)
    layer._ic_after_init()
    return layer


#: Attributes an instrumented layer keeps in its ``__dict__`` (the rest is the stock layer's).
_OURS = ("_ic_scope", "_ic_steps", "_ic_children", "_ic_relation", "_ic_provisional")


def revert(layer: Any) -> Any:
    """Make the instrumented ``layer`` a stock layer of its ``_ic_stock`` class in place:
    the same object, parameters, buffers and ``state_dict``; nothing of ours left on it."""
    cls = type(layer)
    layer.__class__ = cls._ic_stock
    d = layer.__dict__
    for name in [n for n, v in d.items() if n in _OURS or type(v) in (Timed, Handed)]:
        del d[name]
    cls._ic_after_revert(layer)
    return layer


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called")


def _shallow(m: torch.nn.Module) -> torch.nn.Module:
    """A new module object sharing ``m``'s parameters, buffers and children, with its own
    dictionaries of them and of its forward hooks, and none of our timing or caches."""
    c = copy.copy(m)
    for attr in ("_parameters", "_buffers", "_modules", *_HOOK_DICTS):
        d = m.__dict__.get(attr)
        if d is not None:
            c.__dict__[attr] = type(d)(d)
    for name, value in list(c.__dict__.items()):  # (timing is only there during a forward)
        if type(value) in (Timed, Handed) or name == "_ic_children":
            del c.__dict__[name]
    return c


def _copy_children(layer: torch.nn.Module) -> None:
    """Give ``layer`` shallow copies of its children (and of containers' items)."""
    for name, child in list(layer._modules.items()):
        if child is None:
            continue
        child = _shallow(child)
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            for key, item in list(child._modules.items()):
                if item is not None:
                    child._modules[key] = _shallow(item)
        layer._modules[name] = child


def name_layers(model: torch.nn.Module, prefix: str = "", *, keep: bool = False) -> Dict[str, str]:
    """Name every instrumented layer in ``model`` after its attribute path (``convs.0``), and
    give each layer of a heterogeneous model its relation (:mod:`.relations`): a key of
    ``HeteroConv``, ``HeteroGraphConv`` or ``to_hetero`` is spelled canonically in the path
    (``conv1.author__writes__paper``). ``keep``: layers named already (not ``GCNConv#0``, nor
    a name a heterogeneous layer gave its modules) keep their names.

    ``registry.summary(by="layer")`` then shows ``convs.0`` instead of ``GCNConv#0``.
    Returns the mapping from old to new scope names.
    """
    return _name(model, prefix, keep)


def _name(
    model: torch.nn.Module, prefix: str, keep: bool, provisional: bool = False
) -> Dict[str, str]:
    """:func:`name_layers`; ``provisional``: the names given are replaced by a later naming
    with ``keep`` (a heterogeneous layer naming its modules below its own default scope)."""
    renamed = {}
    for name, module, relation in walk(model, prefix):
        if isinstance(module, InstrumentedLayer):
            if not keep or (name and is_default_scope(module)):
                new = name or type(module).__name__
                renamed[module.scope] = new
                module.scope = new
                if provisional:
                    module.__dict__["_ic_provisional"] = True
            if relation is not None:
                module.relation = relation
    return renamed


def is_default_scope(layer: InstrumentedLayer) -> bool:
    """Whether ``layer`` has the scope it was made with (``GCNConv#0``), or one a
    heterogeneous layer gave it, not a name of the user's."""
    return layer.scope.startswith(layer._ic_stock.__name__ + "#") or bool(
        layer.__dict__.get("_ic_provisional")
    )
