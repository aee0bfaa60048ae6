"""What the core knows of ``torch.compile``: whether Dynamo is tracing, frames it must skip.

- :func:`compiling_probe`: this torch's cheapest "is Dynamo tracing this code?" function. A
  step, a region and every hook of ``run`` ask it before anything else, so that what Dynamo
  traces of ours is one call it folds to the constant ``True`` and the plain code after it:
  no guard on our state, no graph break, no recompile.
- :func:`skip_frame`: Dynamo never compiles the frames of a function so marked (a wrapper
  of ``run`` around ``torch.nn.Module.__call__``, which ``torch.compile(model)`` would
  otherwise compile as the model's frame, guards and all); it compiles the frames the
  function calls, as it would without the wrapper; :func:`run_eagerly`: neither that
  function's frames nor those it calls (bookkeeping that a compiled call runs eagerly).
- :func:`traced`: a layer's forward calls it while Dynamo traces it (its plain path): at
  trace time, through ``torch._dynamo.comptime`` (no guard, no graph break, nothing in the
  graph), it notes the layer, the Dynamo compilation it is traced into and the compiled
  call under way (:data:`owner`: ``run``'s ``compiled NAME``, or none). :func:`describe`
  turns the notes into what ran compiled: per compiled call, its layers and how many times
  each runs in one call; and the graph breaks Dynamo recorded, attributed to the conv
  layers whose code caused them.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

__all__ = [
    "compiling_probe",
    "compiling",
    "skip_frame",
    "run_eagerly",
    "traced",
    "listed",
    "owner",
    "describe",
    "forget",
]

logger = logging.getLogger(__name__)


def compiling_probe() -> Callable[[], bool]:
    """The cheapest "is Dynamo tracing this code?" function of this torch version.

    Dynamo turns a call of one of its tracing-state functions into the constant ``True``
    while tracing; eagerly they return ``False``. Steps return a no-op under tracing: Dynamo
    cannot trace their bookkeeping (older versions fail with an internal error instead of
    breaking the graph). ``torch.compiler.is_compiling`` is one Python frame less than
    ``torch._dynamo.external_utils.is_compiling`` (which calls it on newer torch), so it is
    taken where Dynamo folds it (its table of tracing-state functions says so).
    """
    try:
        from torch._dynamo.external_utils import is_compiling
    except ImportError:  # pragma: no cover - very old torch
        fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        return fn if fn is not None else (lambda: False)
    newer = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    try:
        from torch._dynamo.variables import torch as variables

        table = variables.tracing_state_functions
        folded = table() if callable(table) else table
    except Exception:  # noqa: BLE001 - another layout: keep the long-standing one
        folded = {}
    if newer is not None and folded.get(newer) is True:
        return newer
    return is_compiling


#: This torch's "is Dynamo tracing the caller?" (:func:`compiling_probe`).
compiling = compiling_probe()


def skip_frame(fn: Callable) -> Callable:
    """Mark ``fn``'s code so that Dynamo runs its frames as they are and compiles the frames
    they call (``torch._dynamo.eval_frame.skip_code``: torch 2.1 to 2.13 at least); returns
    ``fn``. Where this torch has no such call, nothing is marked (logged once)."""
    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:  # pragma: no cover - a torch without Dynamo's frame table
        logger.info("this torch cannot mark a frame as skipped: %s stays traceable", fn)
        return fn
    skip_code(fn.__code__)
    return fn


def run_eagerly(fn: Callable) -> Callable:
    """``fn`` wrapped so that Dynamo neither compiles nor is offered its frames, nor those of
    what it calls (``torch._dynamo.disable``, recursive); ``fn`` itself where this torch has
    no Dynamo. Only for code that runs outside a trace: traced, the wrapper breaks the graph."""
    try:
        from torch._dynamo import disable
    except ImportError:  # pragma: no cover - a torch without Dynamo
        return fn
    return disable(fn, recursive=True)


# -- what Dynamo traced of our layers ------------------------------------------------------

_lock = threading.Lock()
_numbers = itertools.count(1)
#: (owner step path or "", compilation number, root frame name) -> {scope: times traced}
_traces: Dict[Tuple[str, int, str], Counter] = {}
#: scope -> the layer's class name
_classes: Dict[str, str] = {}
#: compiled call's step name -> {scope: class} of its module tree (:func:`listed`)
_listed: Dict[str, Dict[str, str]] = {}


class _Owner(threading.local):
    """The compiled call under way on this thread (set by ``run``'s hooks around each)."""

    name = ""


#: ``owner.name``: the step name of the compiled call under way (``""``: none known).
owner = _Owner()

try:  # torch 2.0+: a function Dynamo calls at trace time with its context
    from torch._dynamo.comptime import comptime as _comptime
except ImportError:  # pragma: no cover - a torch without Dynamo
    _comptime = None


def _module_of(var: Any, tx: Any) -> Any:
    """The nn.Module a Dynamo variable of a module stands for (torch 2.2: by its key in the
    output graph; newer: its value), or None."""
    value = getattr(var, "value", None)
    if isinstance(value, torch.nn.Module):
        return value
    key = getattr(var, "module_key", None)
    if key is not None and tx is not None:
        return tx.output.get_submodule(key)
    return None


def _note(ctx: Any) -> None:
    """At trace time (``comptime``): note the layer being traced (``traced``'s ``layer``)."""
    try:
        tx = getattr(ctx, "_tx", None) or getattr(ctx, "_ComptimeContext__tx", None)
        var = ctx.get_local("layer")
        layer = _module_of(getattr(var, "_ComptimeVar__variable", var), tx)
        scope = getattr(layer, "scope", None)
        if scope is None or tx is None:
            return
        out = tx.output
        number = getattr(out, "_ic_compilation", None)
        if number is None:
            number = out._ic_compilation = next(_numbers)
        root = out.root_tx.f_code.co_name
        key = (owner.name, number, root)
        with _lock:
            _traces.setdefault(key, Counter())[scope] += 1
            _classes[scope] = type(layer)._ic_stock.__name__
    except Exception:  # noqa: BLE001 - never fail a user's compilation over a note
        logger.debug("a traced layer could not be noted", exc_info=True)


def traced(layer: Any) -> None:
    """Note ``layer`` as traced into a compiled graph; call it only while Dynamo traces."""
    if _comptime is not None:
        _comptime(_note)


def listed(name: str, layers: Dict[str, str]) -> None:
    """The conv layers (scope -> class) of the compiled call ``name``, from its module tree:
    where Dynamo's traces did not note them, a call each per compiled call, estimated."""
    with _lock:
        _listed.setdefault(name, {}).update(layers)


def forget() -> None:
    """Forget every note (after ``torch._dynamo.reset()``; ``registry.reset()`` keeps them:
    compiled graphs outlive it and are not traced again)."""
    with _lock:
        _traces.clear()
        _classes.clear()
        _listed.clear()


def _conv_files() -> Dict[str, str]:
    """Source file -> conv class name, of every conv layer class traced."""
    import inspect
    import sys

    files: Dict[str, str] = {}
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if not name.startswith(("torch_geometric.nn.conv", "dgl.nn.pytorch.conv")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and issubclass(value, torch.nn.Module):
                try:
                    files.setdefault(
                        os.path.realpath(inspect.getsourcefile(value) or ""), value.__name__
                    )
                except TypeError:
                    continue
    return files


def graph_breaks() -> List[Dict[str, Any]]:
    """The graph breaks Dynamo recorded in this process (``torch._dynamo.utils``), each with
    the conv layer class, file, line and function of the innermost frame in a conv layer's
    source (``layer`` None where no frame is in one): {reason, layer, file, line, function}."""
    try:
        from torch._dynamo.utils import graph_break_reasons
    except ImportError:  # pragma: no cover
        return []
    reasons = [r for r in list(graph_break_reasons) if getattr(r, "graph_break", True)]
    if not reasons:
        return []
    files = _conv_files()
    out = []
    for r in reasons:
        where: Dict[str, Any] = {"layer": None, "file": None, "line": None, "function": None}
        for frame in reversed(list(getattr(r, "user_stack", None) or [])):
            cls = files.get(os.path.realpath(frame.filename))
            if cls is not None:
                where = {
                    "layer": cls,
                    "file": os.path.basename(frame.filename),
                    "line": frame.lineno,
                    "function": frame.name,
                }
                break
        reason = str(getattr(r, "reason", r)).strip().splitlines()[0][:200]
        out.append({"reason": reason, **where})
    return out


def describe() -> Optional[Dict[str, Any]]:
    """What ran compiled, for a summary (None when nothing of ours was traced and Dynamo
    recorded no graph break): ``owners``, per step name of a compiled call (``""``: none
    was known, the calls were not counted): ``layers``, per scope its class, its calls per
    compiled call and whether that is ``exact`` (every compilation of the call traced it
    as often, none resumed after a graph break) or estimated (the most of any; a layer
    only :func:`listed`: one); and ``breaks``: :func:`graph_breaks`."""
    with _lock:
        traces = {k: Counter(v) for k, v in _traces.items()}
        classes = dict(_classes)
        listed_ = {k: dict(v) for k, v in _listed.items()}
    breaks = graph_breaks()
    if not traces and not breaks and not listed_:
        return None
    owners: Dict[str, Dict[str, Any]] = {}
    by_owner: Dict[str, List[Tuple[str, Counter]]] = {}
    for (owner, _, root), counts in sorted(traces.items()):
        by_owner.setdefault(owner, []).append((root, counts))
    for owner, comps in by_owner.items():
        resumed = any(root.startswith("torch_dynamo_resume_in") for root, _ in comps)
        scopes = sorted({s for _, c in comps for s in c})
        layers = {}
        for scope in scopes:
            seen = {c.get(scope, 0) for _, c in comps}
            layers[scope] = {
                "class": classes.get(scope, ""),
                "per_call": max(seen),
                "exact": len(seen) == 1 and not resumed,
            }
        owners[owner] = {"compilations": len(comps), "layers": layers}
    for owner, found in listed_.items():
        layers = owners.setdefault(owner, {"compilations": 0, "layers": {}})["layers"]
        for scope, cls in found.items():
            layers.setdefault(scope, {"class": cls, "per_call": 1, "exact": False})
    return {"owners": owners, "breaks": breaks}
