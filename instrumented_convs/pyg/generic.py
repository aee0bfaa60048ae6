"""PyG's message passing, step by step, in every instrumented PyG layer (no copied code):
``propagate`` with ``collect``, ``message``, ``aggregate`` (or ``message_and_aggregate``) and
``update``, and ``edge_updater``.

PyG's hooks miss ``collect`` and ``update``, so these methods are timed on the instance
during an instrumented forward; the classes override none, so PyG generates its stock code.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Dict, Tuple

import torch
from torch_geometric.nn.conv import MessagePassing

from ..core.steps.step import Step
from ..layers.contract import InstrumentedLayer
from ..layers.generic import GenericLayer
from ..layers.statements.routes import any_function, torch_function
from .signals import advise_hook

__all__ = [
    "GenericPyG",
    "method_steps",
    "prepare_class",
    "make_all",
    "NOT_INSTRUMENTED",
    "generate",
    "DetailedPyG",
]

logger = logging.getLogger(__name__)

_STEPS: Dict[str, Step] = {}

#: Whether this PyG generates ``propagate``, ``collect``... from templates (2.5 and later; 2.5
#: does it in the constructor, 2.6 and later at class creation).
GENERATES = os.path.exists(
    os.path.join(os.path.dirname(inspect.getfile(MessagePassing)), "propagate.jinja")
)


def _step(name: str) -> Step:
    s = _STEPS.get(name)
    if s is None:
        s = _STEPS[name] = Step(name)
    return s


def _implemented(stock: type, name: str) -> bool:
    """Whether ``stock`` has its own ``name`` (PyG tells fused or edge-updating layers so)."""
    fn = getattr(stock, name, None)
    return (
        callable(fn)
        and not getattr(fn, "__isabstractmethod__", False)
        and fn is not getattr(MessagePassing, name, None)
    )


def method_steps(stock: type, detailed: bool = False) -> Tuple[Tuple[str, Step], ...]:
    """(method name, step) of each message-passing method of ``stock`` timed in an
    instrumented forward; ``detailed`` leaves out ``propagate`` and ``edge_updater`` (a
    detailed layer's copied forward has its own ``propagate`` step) and ``update`` (its
    vocabulary has no such step)."""
    propagate = not detailed
    names = {"message": "message", "aggregate": "aggregate"}
    if not detailed:
        names["update"] = "update"
    for name in ("_collect", "__collect__"):  # the python propagate's gather (all versions)
        if callable(getattr(stock, name, None)):
            names[name] = "collect"
    edges = _implemented(stock, "edge_update")
    for name in ("message_and_aggregate", "edge_update"):  # only where the layer has them
        if _implemented(stock, name):
            names[name] = name
    if GENERATES:  # PyG >= 2.5 generates these
        names["collect"] = "collect"
        if edges:
            names["edge_collect"] = "collect"
    if propagate:
        names["propagate"] = "propagate"
        if edges:
            names["edge_updater"] = "edge_updater"
    return tuple((name, _step(step)) for name, step in names.items())


def original_methods(stock: type) -> Dict[str, Any]:
    """``propagate`` (and ``edge_updater``) as written, before PyG generated code for ``stock``.

    PyG >= 2.5 keeps the written one as ``_orig_propagate`` of the class it generates for, and
    switches to it for ``decomposed_layers > 1`` and explain mode. It takes it from the class
    at that moment; a subclass made after the stock class generated its code would find the
    stock's *generated* one there, so our classes carry the written one in their own dict.
    """
    if not hasattr(MessagePassing, "_set_jittable_templates") or not issubclass(
        stock, MessagePassing
    ):
        return {}
    out: Dict[str, Any] = {}
    for name in ("propagate", "edge_updater"):
        if name == "edge_updater" and not _implemented(stock, "edge_update"):
            continue
        for k in stock.__mro__:
            d = k.__dict__
            if f"_orig_{name}" in d:
                out[name] = d[f"_orig_{name}"]
                break
            fn = d.get(name)
            if fn is not None and not getattr(fn, "__module__", "").endswith(f"_{name}"):
                out[name] = fn
                break
    return out


def prepare_class(cls: type) -> None:
    """Hand the stock class's reading of its ``propagate``/``edge_updater`` calls to ``cls``:
    PyG finds ``propagate``'s arguments by reading the class's source, which a class made at
    run time has none of (``propagate_type``, PyG's documented alternative)."""
    if cls.__dict__.get("_ic_prepared"):
        return
    stock = cls._ic_stock  # type: ignore[attr-defined]
    try:
        from torch_geometric.inspector import Inspector
    except ImportError:  # PyG < 2.5: nothing is generated from the source
        Inspector = None  # type: ignore[assignment,misc]
    if Inspector is not None and hasattr(Inspector, "get_params_from_method_call"):
        inspector = Inspector(stock)
        for method in ("propagate", "edge_updater"):
            attr = f"{method}_type"
            if hasattr(stock, attr) or (
                method == "edge_updater" and not _implemented(stock, "edge_update")
            ):
                continue
            try:
                params = inspector.get_params_from_method_call(
                    method, exclude=[0, "edge_index", "size"]
                )
            except Exception as e:  # noqa: BLE001 - PyG falls back itself; so do we
                logger.debug("%s: cannot read %s's arguments: %s", stock.__name__, method, e)
                continue
            setattr(cls, attr, {p.name: p.type_repr for p in params.values()})
    cls._ic_prepared = True  # type: ignore[attr-defined]


class DetailedPyG(InstrumentedLayer):
    """Mixin of the detailed PyG layers (``GCNConv``): PyG's message-passing methods timed
    during their copied forward, which has its own ``propagate`` step."""

    #: Children its fallback does not time (the aggregation runs inside ``aggregate``).
    _ic_skip = frozenset({"aggr_module"})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Name the methods to time, and give the subclass the written ``propagate`` for PyG
        to generate from (see :func:`original_methods`)."""
        super().__init_subclass__(**kwargs)
        stock = cls.__dict__.get("_ic_stock")
        if stock is None:  # a user's subclass of ours: it inherits all of this
            return
        cls._ic_methods = method_steps(stock, detailed=True)
        #: What its fallback (upstream's own forward) times: every message-passing method,
        #: ``propagate`` included, as a generic layer does.
        cls._ic_fallback_methods = method_steps(stock)
        for name, fn in original_methods(stock).items():
            setattr(cls, name, fn)

    def _ic_after_init(self) -> None:
        """Have PyG generate this class's code (after construction or convert)."""
        generate(self)

    @staticmethod
    def _ic_after_revert(layer: Any) -> None:
        """Have PyG generate the stock class's code (a layer made stock by revert())."""
        generate(layer)


class GenericPyG(GenericLayer):
    """Mixin of the generic PyG layers: message passing step by step (the methods PyG's
    generated ``propagate`` calls, timed on the instance; PyG 2.3 and 2.4, and 2.5+ with
    ``decomposed_layers > 1`` or in explain mode, run the Python ``propagate``, which calls
    the same methods)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The stock constructor, unchanged, with PyG's code generation made to work for us."""
        if isinstance(self, MessagePassing):
            # our class (the nearest, for a user's subclass of it, which inherits its reading)
            prepare_class(next(k for k in type(self).__mro__ if "_ic_stock" in k.__dict__))
        super().__init__(*args, **kwargs)

    def _ic_after_init(self) -> None:
        """PyG's code generation for this class, if not done (after construction or convert)."""
        super()._ic_after_init()
        if isinstance(self, MessagePassing):
            generate(self)

    @staticmethod
    def _ic_after_revert(layer: Any) -> None:
        """PyG's code generation for the stock class, if not done (TorchScript needs it: a
        stock copy or a layer given back by uninstrument() never ran the stock constructor)."""
        if isinstance(layer, MessagePassing):
            generate(layer)


def generate(layer: Any) -> None:
    """Have PyG generate ``propagate`` for ``layer``'s class if it has not yet (a layer whose
    class was swapped by instrument()/uninstrument(): PyG generates at construction only)."""
    cls = type(layer)
    if "_jinja_propagate" in cls.__dict__ or not hasattr(layer, "_set_jittable_templates"):
        return
    if "_ic_stock" in cls.__dict__:
        prepare_class(cls)
    try:
        layer._set_jittable_templates()
    except Exception as e:  # noqa: BLE001 - the inherited propagate still computes the same
        logger.debug("%s: PyG could not generate propagate: %s", cls.__name__, e)


#: Classes of ``torch_geometric.nn.conv.__all__`` that get no instrumented version, and why.
NOT_INSTRUMENTED: Dict[str, str] = {
    "MessagePassing": "the base class of the conv layers, not a layer: subclass an instrumented "
    "layer or use instrument() on your model",
}


def make_all(module: str, detailed: frozenset, through: Dict[str, Any]) -> Dict[str, type]:
    """A generic instrumented class for every class of ``torch_geometric.nn.conv.__all__``
    not in ``detailed`` or :data:`NOT_INSTRUMENTED`, named as upstream, living in ``module``;
    a routed function named in ``through`` runs the function given there (the detailed
    ``gcn_norm``, whose parts are steps, where SGConv, APPNP, TAGConv... call upstream's)."""
    import torch_geometric.nn.conv as conv

    from ..layers.generic import make_all as make

    def namespace(stock: type) -> Dict[str, Any]:
        if not issubclass(stock, MessagePassing):
            return {}
        hook = advise_hook(stock)
        advise = {} if hook is None else {"_ic_advise": staticmethod(hook)}
        return {"_ic_methods": method_steps(stock), **original_methods(stock), **advise}

    made = make(conv, module, GenericPyG, detailed, NOT_INSTRUMENTED, namespace, VOCABULARY)
    for routes in {id(k._ic_routes): k._ic_routes for k in made.values() if k._ic_routes}.values():
        routes.add(through=through)
    return made


#: What a PyG layer's forward calls that is timed as a step during its calls
#: (:mod:`~instrumented_convs.layers.statements.routes`):
#: PyG's own functions (``add_self_loops``, ``softmax``, ``gcn_norm``...) and torch-sparse's,
#: ``F.<function>`` and most ``torch.<function>`` (not views, predicates or grad modes).
VOCABULARY = (
    ("torch_geometric", "torch_sparse", "torch_scatter"),
    {"torch.nn.functional": any_function, "torch": torch_function, "torch_sparse": any_function},
    frozenset(),
    frozenset(),
    (MessagePassing, torch.nn.Module),
)
