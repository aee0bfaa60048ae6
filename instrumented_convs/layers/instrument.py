"""``instrument(model)`` and ``uninstrument(model)``: instrument a model one did not write.

Each conv layer whose type is exactly a PyG or DGL conv class swaps its class for the
instrumented one, in place, and back: the same modules, parameters and ``state_dict`` keys,
so an optimizer built before keeps working. Users' own subclasses are left alone.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Collection, Dict, Optional, TypeVar

import torch

from .contract import InstrumentedLayer, convert, name_layers, revert
from .relations import walk

__all__ = ["instrument", "uninstrument"]

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=torch.nn.Module)

_FRAMEWORKS = (("torch_geometric", "instrumented_convs.pyg"), ("dgl", "instrumented_convs.dgl"))


def _table() -> Dict[type, type]:
    """Stock conv class -> instrumented class, for each framework already imported."""
    table: Dict[type, type] = {}
    for framework, ours in _FRAMEWORKS:
        if framework not in sys.modules:
            continue  # a model of this framework's layers would have imported it
        try:
            module = importlib.import_module(ours)
        except ImportError as e:  # pragma: no cover - a broken install of the framework
            logger.warning("instrument: cannot import %s: %s", ours, e)
            continue
        for name in module.__all__:
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, InstrumentedLayer):
                table[cls._ic_stock] = cls
    return table


def _put_back_scripted(model: torch.nn.Module) -> None:
    """Put back the instrumented layers ``torch.jit.script(model)`` replaced by stock copies
    in ``model`` itself (see ``InstrumentedLayer.__prepare_scriptable__``)."""
    for parent in model.modules():
        for key, child in list(parent._modules.items()):
            kept = None if child is None else child.__dict__.get("_ic_scripted_from")
            if kept is not None:
                parent._modules[key] = kept[0]


def instrument(
    model: M,
    name: bool = True,
    *,
    only: Optional[Collection[str]] = None,
    exclude: Collection[str] = (),
) -> M:
    """Instrument ``model``'s stock PyG and DGL conv layers in place; returns ``model``.

    Layers already instrumented (by import or by an earlier call) are left as they are, so
    calling it twice is harmless; layers ``torch.jit.script(model)`` left as stock copies in
    the model are put back. With ``name`` (the default), every instrumented layer's
    scope becomes its attribute path (as :func:`~instrumented_convs.name_layers` does).
    ``only`` (class names, ``{"GCNConv", "SAGEConv"}``) instruments those classes alone;
    ``exclude`` leaves those classes stock. A name matches the classes of that name in both
    frameworks. The layers of a heterogeneous model (``to_hetero``, ``HeteroConv``,
    ``HeteroGraphConv``) get their relation, named or not (``summary(by="relation")``).
    """
    if isinstance(only, str) or isinstance(exclude, str):
        raise TypeError("only= and exclude= take a collection of class names, not one string")
    _put_back_scripted(model)
    table = _table()
    for module in model.modules():
        cls = table.get(type(module))
        if cls is None:
            continue
        stock = cls._ic_stock.__name__
        if (only is None or stock in only) and stock not in exclude:
            convert(module, cls)
    if name:
        name_layers(model)
    else:  # the relations of a heterogeneous model all the same
        for _, module, relation in walk(model):
            if relation is not None and isinstance(module, InstrumentedLayer):
                module.relation = relation
    return model


def uninstrument(model: M) -> M:
    """Give every instrumented layer in ``model`` back its stock class, in place; returns it.

    The layers run the stock code again and record nothing; parameters and ``state_dict``
    are unchanged.
    """
    for module in model.modules():
        if isinstance(module, InstrumentedLayer):
            revert(module)
    return model
