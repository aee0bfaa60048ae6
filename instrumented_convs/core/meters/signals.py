"""What the advice's rules need from the layers' calls (``configure(advise=True)``): per layer
instance, its calls, whether every call saw the same graph, and its last call's graph kept for
the checks made once when the signals are read (self-loops already there, nodes without an
in-edge): no device synchronisation while the job runs. Layers call :func:`note`; the rules
read :func:`describe`.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, List, Tuple

import torch

__all__ = [
    "on",
    "set_on",
    "keep_layers",
    "again",
    "graph_key",
    "note",
    "describe",
    "alive",
    "set_trial",
    "clear",
]

#: ``static(layer)``: what a layer's kind knows of it (its options), read at its first call;
#: ``checks(last)``: what it knows of its last graph, read when the signals are.
Static = Callable[[Any], Dict[str, Any]]
Checks = Callable[[Any], Dict[str, Any]]


class _Layer:
    __slots__ = (
        "ref",
        "path",
        "cls",
        "framework",
        "static",
        "calls",
        "key",
        "changed",
        "last",
        "checks",
        "held",
        "inputs",
        "trials",
        "kept",
        "fresh",
        "previous",
        "same_as",
    )

    def __init__(
        self, layer: Any, framework: str, key: Tuple[Any, ...], static: Static, checks: Checks
    ) -> None:
        self.ref = weakref.ref(layer)
        self.path = getattr(layer, "scope", None)  # (again at the end, where it is alive)
        self.cls = type(layer).__name__
        self.framework = framework
        self.static = static(layer)
        self.calls = 0
        self.key = key
        self.changed = 0  #: calls whose graph was not the one before
        self.last: Any = None
        self.checks = checks
        self.held: Tuple[Any, ...] = ()  #: the last call's graph objects and their versions
        self.inputs: Any = None  #: the last call's ``(args, kwargs)``, held (no copy)
        self.trials: Dict[str, Any] = {}  #: changes timed on the layer (layers.trials)
        #: calls given a graph whose sparse formats were still to be made (DGL: made inside
        #: the call), the graph before the last such one (held), and how to compare the two
        self.fresh = 0
        self.previous: Any = None
        self.same_as: Any = None
        #: the layer itself, held where :func:`keep_layers` asked (``run``: timed after the
        #: script's end, when a model made in a function is gone)
        self.kept = layer if _state["keep"] else None


_layers: Dict[int, _Layer] = {}
_lock = threading.Lock()
_state = {"on": False, "keep": False}


def on() -> bool:
    """Whether the layers note their calls (``configure(advise=True)``)."""
    return _state["on"]


def keep_layers(value: bool) -> None:
    """Hold each layer noted from now on (not only a weak reference), until :func:`clear`:
    ``run --advise`` times the changes after the script's end, when its model may be gone."""
    _state["keep"] = bool(value)


def set_on(value: bool) -> None:
    """Switch the noting on or off (what was noted stays until :func:`clear`)."""
    _state["on"] = bool(value)


def _pointer(p: torch.Tensor) -> Any:
    """A tensor's data pointer; a ``torch.sparse`` tensor's (no storage of its own): its
    index and value tensors' pointers."""
    if p.layout is torch.strided:
        return p.data_ptr()
    if p.layout is torch.sparse_coo:
        parts = (p._indices(), p._values())
    elif p.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = (p.crow_indices(), p.col_indices(), p.values())
    else:
        parts = (p.ccol_indices(), p.row_indices(), p.values())
    return tuple(t.data_ptr() for t in parts)


def _fingerprint(p: Any) -> Any:
    """A tensor's version and data pointer (``.data =`` changes the one, in-place ops the
    other); None for another object (its identity is all)."""
    return (p._version, _pointer(p)) if isinstance(p, torch.Tensor) else None


def again(layer: Any, inputs: Any, *objs: Any) -> bool:
    """The fast path of a call: where ``layer``'s last call was given these very objects (a
    tensor at the same version and data pointer: unchanged), count this call on the same graph,
    hold its ``inputs`` (``(args, kwargs)``) and return True (a few identity checks, no key
    made); else False (then :func:`note` it)."""
    rec = _layers.get(id(layer))
    if rec is None or len(rec.held) != len(objs):
        return False
    for (held, state), p in zip(rec.held, objs):
        if held is not p or (state is not None and state != (p._version, _pointer(p))):
            return False
    if rec.ref() is not layer:
        return False
    rec.calls += 1
    rec.inputs = inputs
    return True


def graph_key(*parts: Any) -> Tuple[Any, ...]:
    """What tells one graph from another across calls: for each tensor (or object) a weak
    reference to it, its storage, version and shape, so that a graph made anew (an inductive
    loop's batch), changed in place or freed and its memory reused is never the same."""
    key: List[Any] = []
    for p in parts:
        if p is None:
            key.append(None)
            continue
        try:
            ref: Any = weakref.ref(p)
        except TypeError:  # not weakly referable: its identity while it is held (``last``)
            ref = id(p)
        shape = getattr(p, "shape", None)
        if isinstance(p, torch.Tensor) and p.layout is not torch.strided:
            key.append((ref, _pointer(p), p._version, tuple(shape)))
        elif shape is not None and hasattr(p, "untyped_storage"):
            key.append((ref, p.untyped_storage().data_ptr(), p._version, tuple(shape)))
        else:
            key.append((ref,))
    return tuple(key)


def _same(a: Tuple[Any, ...], b: Tuple[Any, ...]) -> bool:
    """Whether two :func:`graph_key` keys name one graph (their objects alive and the same)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is None or y is None:
            if x is not y:
                return False
            continue
        rx, ry = x[0], y[0]
        if isinstance(rx, weakref.ref):
            if not isinstance(ry, weakref.ref) or rx() is None or rx() is not ry():
                return False
        elif rx != ry:
            return False
        if x[1:] != y[1:]:
            return False
    return True


def note(
    layer: Any,
    framework: str,
    key: Tuple[Any, ...],
    last: Any,
    static: Static,
    checks: Checks,
    held: Tuple[Any, ...] = (),
    inputs: Any = None,
    fresh: bool = False,
    same_as: Any = None,
) -> None:
    """One call of ``layer`` (``framework``: ``pyg`` or ``dgl``) on the graph ``key`` names
    (:func:`graph_key`); ``last``: that call's graph inputs, kept (the last call's only) for
    ``checks(last)`` when the signals are read; ``static(layer)`` read at the first call (a
    layer freed before the end keeps it); ``held``: the objects :func:`again` compares the
    next call's with; ``inputs``: the call's ``(args, kwargs)``, held (no copy) for the
    changes timed on the layer at the end (:mod:`instrumented_convs.layers.trials`);
    ``fresh``: the graph's sparse formats were still to be made (the call makes them), the
    graph before it then held too, for ``same_as(previous, last)`` when the signals are read
    (whether the graph made anew was the same)."""
    rec = _layers.get(id(layer))
    if rec is None or rec.ref() is not layer:
        with _lock:
            rec = _layers[id(layer)] = _Layer(layer, framework, key, static, checks)
    elif not _same(rec.key, key):
        rec.changed += 1
        rec.key = key
    if fresh:
        rec.fresh += 1
        rec.previous, rec.same_as = rec.last, same_as
    rec.calls += 1
    rec.last = last
    rec.held = tuple((p, _fingerprint(p)) for p in held)
    rec.inputs = inputs


def describe() -> Dict[str, Any]:
    """The signals as plain data: ``{"layers": [...]}``, each layer's ``path`` (its scope
    now, or at its first call where it was freed since), ``class``, ``framework``, ``calls``,
    ``same_graph`` (every call saw the first call's graph), what its kind knows of it
    (``options``...) and of its last graph."""
    out = []
    for rec in list(_layers.values()):
        layer = rec.ref()
        item: Dict[str, Any] = {
            "path": rec.path if layer is None else getattr(layer, "scope", rec.path),
            "class": rec.cls,
            "framework": rec.framework,
            "calls": rec.calls,
            "same_graph": rec.changed == 0,
            **rec.static,
        }
        if rec.trials:
            item["trials"] = dict(rec.trials)
        if rec.fresh:
            item["fresh_graph_calls"] = rec.fresh
        try:
            item.update(rec.checks(rec.last))
            if rec.fresh > 1 and rec.previous is not None and rec.same_as is not None:
                item["graph_remade"] = bool(rec.same_as(rec.previous, rec.last))
        except Exception as exc:  # a check that cannot be made: said, not raised
            item["checks_error"] = f"{type(exc).__name__}: {exc}"
        out.append(item)
    return {"layers": out}


def alive() -> List[Tuple[Any, Dict[str, Any]]]:
    """The noted layers still alive with their last call's inputs: ``(layer, facts)``, the
    facts ``framework``, ``calls``, ``same_graph``, ``fresh_graph_calls``, ``inputs``
    (``(args, kwargs)``) and ``timed`` (the rules whose change was timed on it already)."""
    out = []
    for rec in list(_layers.values()):
        layer = rec.ref()
        if layer is not None and rec.inputs is not None:
            facts = {"framework": rec.framework, "calls": rec.calls, "inputs": rec.inputs}
            facts["fresh_graph_calls"] = rec.fresh
            out.append((layer, {**facts, "same_graph": rec.changed == 0, "timed": set(rec.trials)}))
    return out


def set_trial(layer: Any, rule: str, result: Dict[str, Any]) -> None:
    """What timing the change of ``rule`` on ``layer`` found (plain data, saved with the
    signals)."""
    rec = _layers.get(id(layer))
    if rec is not None and rec.ref() is layer:
        rec.trials[rule] = result


def clear() -> None:
    """Forget every layer's signals (a reset)."""
    with _lock:
        _layers.clear()
