"""PyG's message passing, step by step, in every instrumented PyG layer (no copied code).

PyG generates each class's ``propagate`` from ``propagate.jinja`` (PyG 2.5 and later) at the
first construction of the class, and the generated code calls, through ``self``: ``collect``
(the gather of node features onto edges, ``x_j = x[edge_index[0]]``), then ``message``,
``aggregate`` and ``update``, or ``message_and_aggregate`` and ``update`` on the fused
(sparse) path; ``edge_updater`` calls ``edge_collect`` and ``edge_update``. PyG's own hook
API (``register_message_forward_pre_hook``...) has no hook for ``collect`` or ``update``, and
a step opened in one hook and closed in another stays open when the code between raises.
So each of these methods runs inside a ``with <step>:`` block of a wrapper that
:func:`functools.wraps` the stock method: PyG inspects the wrapped signature (it follows
``__wrapped__``), so it collects the same arguments and generates the same code. Steps::

    propagate
      collect                the gather (x_i, x_j, edge attributes per edge)
      message
      aggregate              PyG's aggregation module inside
      message_and_aggregate  the fused sparse path instead of the three above
      update
    edge_updater             (layers with edge_update: GATConv's attention logits)
      collect
      edge_update

``message``, ``aggregate``, ``update``, ``message_and_aggregate`` and ``edge_update`` are
wrapped when the class is made (the last two only where the stock class implements them);
the generated ``propagate``, ``collect``, ``edge_updater`` and ``edge_collect`` are wrapped
right after PyG generates them (:func:`wrap_generated`). PyG finds the arguments of
``propagate`` by reading the class's source, which a class made at run time has none of:
the stock class's reading is handed over as ``propagate_type`` (and ``edge_updater_type``),
PyG's documented alternative. PyG 2.3 and 2.4 have no generated code: there the python
``propagate`` calls the same methods and ``_collect``/``__collect__``.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict

from torch_geometric.nn.conv import MessagePassing

from . import _config
from ._generic import GenericLayer
from ._layers import InstrumentedLayer
from ._step import Step, _is_compiling

__all__ = ["GenericPyG", "method_wrappers", "wrap_generated", "prepare_class", "make_all", "NOT_INSTRUMENTED",
           "generate", "DetailedPyG"]

logger = logging.getLogger(__name__)

_STEPS: Dict[str, Step] = {}


def _step(name: str) -> Step:
    s = _STEPS.get(name)
    if s is None:
        s = _STEPS[name] = Step(name)
    return s


def _wrap(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` (a method) inside the step ``name``; PyG still sees ``fn``'s signature."""
    st = _step(name)

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _config.enabled or _is_compiling():
            return fn(self, *args, **kwargs)
        with st:
            return fn(self, *args, **kwargs)

    wrapper._ic_step = name  # type: ignore[attr-defined]
    return wrapper


def _implemented(stock: type, name: str) -> bool:
    """Whether ``stock`` has its own ``name`` (PyG tells fused or edge-updating layers so)."""
    fn = getattr(stock, name, None)
    return (callable(fn) and not getattr(fn, "__isabstractmethod__", False)
            and fn is not getattr(MessagePassing, name, None))


def method_wrappers(stock: type) -> Dict[str, Any]:
    """The wrapped message-passing methods of ``stock`` (a MessagePassing class)."""
    ns: Dict[str, Any] = {}
    for name in ("message", "aggregate", "update"):
        ns[name] = _wrap(getattr(stock, name), name)
    for name in ("message_and_aggregate", "edge_update"):  # only where the layer has them
        if _implemented(stock, name):
            ns[name] = _wrap(getattr(stock, name), name)
    for name in ("_collect", "__collect__"):  # the python propagate's gather (all versions)
        if callable(getattr(stock, name, None)):
            ns[name] = _wrap(getattr(stock, name), "collect")
    if not hasattr(MessagePassing, "_set_jittable_templates"):  # PyG < 2.5: nothing generated
        for name in ("propagate", "edge_updater"):
            if callable(getattr(stock, name, None)):
                ns[name] = _wrap(getattr(stock, name), name)
    return ns


def original_methods(stock: type) -> Dict[str, Any]:
    """``propagate`` (and ``edge_updater``) as written, before PyG generated code for ``stock``.

    PyG >= 2.5 keeps the written one as ``_orig_propagate`` of the class it generates for, and
    switches to it for ``decomposed_layers > 1`` and explain mode. It takes it from the class
    at that moment; a subclass made after the stock class generated its code would find the
    stock's *generated* one there, so our classes carry the written one in their own dict.
    """
    if not hasattr(MessagePassing, "_set_jittable_templates") or not issubclass(stock, MessagePassing):
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


#: Methods PyG generates on the class at its first construction, and their step names.
_GENERATED = {
    "propagate": "propagate", "_jinja_propagate": "propagate", "_orig_propagate": "propagate",
    "collect": "collect", "edge_updater": "edge_updater",
    "_jinja_edge_updater": "edge_updater", "_orig_edge_updater": "edge_updater",
    "edge_collect": "collect",
}


def wrap_generated(cls: type, skip: frozenset = frozenset()) -> None:
    """Wrap the methods PyG generated on ``cls`` (once; names in ``skip`` are left alone)."""
    d = cls.__dict__
    for attr, name in _GENERATED.items():
        fn = d.get(attr)
        if fn is not None and name not in skip and not hasattr(fn, "_ic_step"):
            setattr(cls, attr, _wrap(fn, name))


def prepare_class(cls: type) -> None:
    """Hand the stock class's reading of its ``propagate``/``edge_updater`` calls to ``cls``."""
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
            if hasattr(stock, attr) or (method == "edge_updater" and not _implemented(stock, "edge_update")):
                continue
            try:
                params = inspector.get_params_from_method_call(method, exclude=[0, "edge_index", "size"])
            except Exception as e:  # noqa: BLE001 - PyG falls back itself; so do we
                logger.debug("%s: cannot read %s's arguments: %s", stock.__name__, method, e)
                continue
            setattr(cls, attr, {p.name: p.type_repr for p in params.values()})
    cls._ic_prepared = True  # type: ignore[attr-defined]


class DetailedPyG(InstrumentedLayer):
    """Mixin of the detailed PyG layers (``GCNConv``): PyG's gather as a ``collect`` step too
    (their copied ``forward`` has its own ``propagate`` step)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap the stock class's python gather (``_collect``) for the subclass, and give it
        the written ``propagate`` for PyG to generate from (see :func:`original_methods`)."""
        super().__init_subclass__(**kwargs)
        stock = cls.__dict__.get("_ic_stock")
        if stock is None:  # a user's subclass of ours: it inherits all of this
            return
        for name, fn in method_wrappers(stock).items():
            if name in ("_collect", "__collect__"):
                setattr(cls, name, fn)
        for name, fn in original_methods(stock).items():
            setattr(cls, name, fn)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The stock constructor; then PyG's generated gather runs inside a collect step."""
        super().__init__(*args, **kwargs)
        self._ic_after_init()

    def _ic_after_init(self) -> None:
        """Wrap the gather PyG generated for this class (after construction or convert)."""
        generate(self)
        wrap_generated(type(self), skip=frozenset({"propagate", "edge_updater"}))


class GenericPyG(GenericLayer):
    """Mixin of the generic PyG layers: message passing step by step (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """The stock constructor, unchanged, with PyG's code generation made to work for us."""
        if isinstance(self, MessagePassing):
            # our class (the nearest, for a user's subclass of it, which inherits its reading)
            prepare_class(next(k for k in type(self).__mro__ if "_ic_stock" in k.__dict__))
        super().__init__(*args, **kwargs)

    def to_stock(self) -> Any:
        """A stock copy sharing parameters; PyG generates the stock class's code if it has
        not yet (TorchScript needs it: the copy never ran the stock constructor)."""
        out = super().to_stock()
        if isinstance(out, MessagePassing):
            generate(out)
        return out

    def _ic_after_init(self) -> None:
        """Timed children, and the steps around the message-passing code PyG generated."""
        super()._ic_after_init()
        if isinstance(self, MessagePassing):
            generate(self)
            wrap_generated(type(self))


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


def make_all(module: str, detailed: frozenset) -> Dict[str, type]:
    """A generic instrumented class for every class of ``torch_geometric.nn.conv.__all__``
    not in ``detailed`` or :data:`NOT_INSTRUMENTED`, named as upstream, living in ``module``."""
    import torch_geometric.nn.conv as conv

    from ._generic import make_all as make

    def namespace(stock: type) -> Dict[str, Any]:
        if not issubclass(stock, MessagePassing):
            return {}
        return {**method_wrappers(stock), **original_methods(stock)}

    return make(conv, module, GenericPyG, detailed, NOT_INSTRUMENTED, namespace)
