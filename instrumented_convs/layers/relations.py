"""The relations of heterogeneous models: which layers compute which edge type, spelled one way
across PyG and DGL releases (``author__writes__paper``), and the paths that name them.

A relation is found where a model keeps a module per edge type: PyG's ``HeteroConv``
(``convs``), DGL's ``HeteroGraphConv`` (``mods``) and the module dicts ``to_hetero`` puts in
its ``torch.fx.GraphModule``. Nothing here imports PyG or DGL: their classes are known by name.
"""

from __future__ import annotations

import ast
from typing import Any, Iterator, Optional, Tuple

import torch

__all__ = ["SEPARATOR", "canonical", "holder_attribute", "child_names", "walk"]

#: What joins an edge type's parts: PyG's own spelling of a key (``to_hetero``, PyG 2.3).
SEPARATOR = "__"

#: The stock classes that hold a module per relation, by qualified name: the attribute of
#: their module dict.
_HOLDERS = {
    "torch_geometric.nn.conv.hetero_conv.HeteroConv": "convs",
    "dgl.nn.pytorch.hetero.HeteroGraphConv": "mods",
}


def canonical(key: Any) -> str:
    """An edge type as one string: ``("author", "writes", "paper")``, PyG's module-dict key
    ``<author___writes___paper>`` (2.4 on; ``.`` kept as ``#``), ``to_hetero``'s and PyG 2.3's
    ``author__writes__paper`` and DGL's ``str`` of a canonical edge type all give
    ``author__writes__paper``; a plain edge type name stays as it is."""
    if isinstance(key, tuple):
        return SEPARATOR.join(str(k) for k in key)
    key = str(key)
    if key.startswith("<") and key.endswith(">"):
        inner = key[1:-1].replace("#", ".")
        return SEPARATOR.join(inner.split("___")) if "___" in inner else inner
    if key.startswith("(") and key.endswith(")"):  # DGL: str(('user', 'follows', 'game'))
        try:
            parts = ast.literal_eval(key)
        except (ValueError, SyntaxError):
            return key
        if isinstance(parts, tuple) and all(isinstance(p, str) for p in parts):
            return SEPARATOR.join(parts)
    return key


def holder_attribute(module: torch.nn.Module) -> Optional[str]:
    """The attribute of ``module``'s dict of modules per relation, if its class (or the stock
    class an instrumented one stands for) keeps one (``HeteroConv``: ``convs``)."""
    cls = getattr(type(module), "_ic_stock", type(module))
    return _HOLDERS.get(f"{cls.__module__}.{cls.__qualname__}")


def _relation_keys(container: torch.nn.Module, graph: bool) -> bool:
    """Whether ``container`` is a dict of ``to_hetero``'s copies, a plain ``ModuleDict``
    inside a ``torch.fx.GraphModule``: its keys that join parts (edge types) are relations,
    the others node types."""
    return graph and type(container) is torch.nn.ModuleDict


def child_names(
    module: torch.nn.Module, graph: bool = False
) -> Iterator[Tuple[str, torch.nn.Module, Optional[str]]]:
    """``module``'s direct children (items of a module list or dict as ``name.key``) with the
    relation each computes, or None; keys of relations in their canonical spelling.
    ``graph``: ``module`` is inside a ``torch.fx.GraphModule``."""
    holder = holder_attribute(module)
    own = _relation_keys(module, graph)  # a dict of relations walked itself
    seen = set()  # a module under two names is one child (the first), as named_children has it
    for name, child in module._modules.items():
        if child is None or id(child) in seen:
            continue
        seen.add(id(child))
        if own:
            shown = canonical(name)
            yield shown, child, shown if SEPARATOR in shown else None
            continue
        if not isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            yield name, child, None
            continue
        related = name == holder or _relation_keys(child, graph)
        external = getattr(child, "to_external_key", None)  # PyG's ModuleDict
        items = set()
        for key, item in child._modules.items():
            if item is None or id(item) in items:
                continue
            items.add(id(item))
            if external is not None:
                shown = canonical(external(key))
            else:
                shown = canonical(key) if related else key
            relation = shown if related and (name == holder or SEPARATOR in shown) else None
            yield f"{name}.{shown}", item, relation


def walk(
    model: torch.nn.Module, prefix: str = ""
) -> Iterator[Tuple[str, torch.nn.Module, Optional[str]]]:
    """Every module of ``model`` once, as ``named_modules`` gives them, with its path (keys
    of relations spelled canonically) and the relation it computes (that of the nearest
    module dict of relations above it), or None."""
    seen = set()
    todo = [(prefix, model, None, isinstance(model, torch.fx.GraphModule))]
    while todo:
        path, module, relation, graph = todo.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield path, module, relation
        inside = graph or isinstance(module, torch.fx.GraphModule)
        children = [
            (f"{path}.{name}" if path else name, child, rel or relation, inside)
            for name, child, rel in child_names(module, inside)
        ]
        todo.extend(reversed(children))
