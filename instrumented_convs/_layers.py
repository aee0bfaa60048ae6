"""The contract every instrumented layer follows, and naming layers after their attributes.

An instrumented layer is a subclass of the stock layer with :class:`InstrumentedLayer` first
in its bases::

    class GCNConv(InstrumentedLayer, torch_geometric.nn.GCNConv):
        _ic_stock = torch_geometric.nn.GCNConv      # the stock class
        _ic_shared = ("lin", "bias", ...)          # state to_stock/from_stock share

        @classmethod
        def _ic_constructor(cls, layer): ...        # (args, kwargs) that rebuild `layer`

        def forward(self, ...):
            if not instrumenting():
                return super().forward(...)         # disabled: the stock code, nothing else
            with self._ic_step(device):             # the layer's own step, scoped per instance
                ...

What the contract gives every layer: the stock constructor, unchanged (arguments pass
through, so each upstream version's own defaults apply); a default scope per instance
(``GCNConv#0``, ``GCNConv#1``...; :func:`name_layers` renames them after the model's
attributes); the layer's own top-level step, built once per (scope, device);
:meth:`~InstrumentedLayer.to_stock` / :meth:`~InstrumentedLayer.from_stock` sharing
parameters with a stock layer; and ``torch.jit.script`` compiling the stock layer instead.
"""
from __future__ import annotations

import itertools
import logging
import threading
from typing import Any, ClassVar, Dict, Iterator, Tuple, TypeVar

import torch

from ._step import Step

__all__ = ["InstrumentedLayer", "instance_scope", "name_layers"]

logger = logging.getLogger(__name__)

_counters: Dict[str, Iterator[int]] = {}
_lock = threading.Lock()

L = TypeVar("L", bound="InstrumentedLayer")


def instance_scope(kind: str) -> str:
    """A fresh default scope for a layer instance: ``GCNConv#0``, ``GCNConv#1``, ..."""
    with _lock:
        counter = _counters.setdefault(kind, itertools.count())
        return f"{kind}#{next(counter)}"


class InstrumentedLayer:
    """Mixin of every instrumented layer (put it first in the bases, before the stock class)."""

    #: The stock class this layer instruments.
    _ic_stock: ClassVar[type]
    #: Attributes (parameters, submodules, caches) that to_stock/from_stock share.
    _ic_shared: ClassVar[Tuple[str, ...]] = ()
    #: Methods of the layer timed as steps during its instrumented forward: (name, Step)
    #: pairs (see ``_generic.install``); none by default.
    _ic_methods: ClassVar[Tuple[Tuple[str, Step], ...]] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The stock constructor, arguments passed through unchanged; then a default scope."""
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._ic_scope = instance_scope(self._ic_stock.__name__)

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
        self._ic_scope = name
        self.__dict__.pop("_ic_steps", None)

    def _ic_step(self, device: torch.device) -> Step:
        """The layer's own top-level step for ``device``, built once per (scope, device)."""
        cache = self.__dict__.get("_ic_steps")
        if cache is None:
            cache = self.__dict__["_ic_steps"] = {}
        key = (self._ic_scope, device)
        s = cache.get(key)
        if s is None:
            s = cache[key] = Step(self._ic_stock.__name__, scope=self._ic_scope, device=device)
        return s

    @classmethod
    def _ic_constructor(cls, layer: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """The constructor arguments that rebuild ``layer`` (stock or ours); per layer class."""
        raise NotImplementedError(f"{cls.__name__} does not say how to rebuild a layer")

    def to_stock(self) -> Any:
        """A stock layer sharing this layer's parameters (and caches) and train/eval mode."""
        args, kwargs = self._ic_constructor(self)
        return _share_state(self, self._ic_stock(*args, **kwargs), self._ic_shared)

    @classmethod
    def from_stock(cls: "type[L]", layer: Any) -> L:
        """An instrumented layer sharing the parameters (and caches) of a stock ``layer``."""
        args, kwargs = cls._ic_constructor(layer)
        return _share_state(layer, cls(*args, **kwargs), cls._ic_shared)

    def __prepare_scriptable__(self) -> Any:
        """``torch.jit.script`` compiles the stock layer (sharing parameters) instead.

        TorchScript cannot compile the instrumentation, so a scripted model runs the stock
        code and records no steps; a warning says so.
        """
        stock = self._ic_stock
        logger.warning(
            "torch.jit.script: %s.%s is replaced by the stock %s.%s (same parameters); the "
            "scripted model records no steps", type(self).__module__, type(self).__name__,
            stock.__module__, stock.__name__)
        return self.to_stock()


def _share_state(src: torch.nn.Module, dst: Any, names: Tuple[str, ...]) -> Any:
    """Make ``dst`` use ``src``'s attributes ``names`` (None skipped) and its train/eval mode."""
    for name in names:
        value = getattr(src, name)
        if value is not None:
            setattr(dst, name, value)
    dst.train(src.training)
    return dst


def name_layers(model: torch.nn.Module, prefix: str = "") -> Dict[str, str]:
    """Name every instrumented layer in ``model`` after its attribute path (``convs.0``).

    ``registry.summary(by="layer")`` then shows ``convs.0`` instead of ``GCNConv#0``.
    Returns the mapping from old to new scope names.
    """
    renamed = {}
    for name, module in model.named_modules(prefix=prefix):
        if isinstance(module, InstrumentedLayer):
            new = name or type(module).__name__
            renamed[module.scope] = new
            module.scope = new
    return renamed
