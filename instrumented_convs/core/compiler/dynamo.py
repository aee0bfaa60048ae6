"""What the core knows of ``torch.compile``: whether Dynamo is tracing (:data:`compiling`), whether
eager code runs inside a compiled call, which frames Dynamo must skip, and which layers were
traced into which compiled call (:func:`describe`).

Every step and hook asks :data:`compiling` first, so what Dynamo traces of ours folds to a
constant: no guard, no graph break, no recompile.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import itertools
import logging
import sys
import threading
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..native import private
from . import breaks

__all__ = [
    "compiling_probe",
    "compiling",
    "inside_compiled",
    "skip_frame",
    "run_eagerly",
    "traced",
    "listed",
    "owner",
    "describe",
    "forget",
]

logger = logging.getLogger(__name__)

#: Importing Dynamo costs more than a second, and nothing compiles before it is imported:
#: what must be told to it (the frames it must skip, :data:`compiling` as a constant) is told
#: as soon as it is imported, by ``torch.compile``, PyG or anyone (:class:`_OnDynamoImport`).
_DYNAMO = "torch._dynamo"
_pending: List[Callable[[], None]] = []
_told = threading.Lock()
_skip_code: Any = None


def _dynamo_ready() -> bool:
    """Whether Dynamo is imported whole (not under way)."""
    module = sys.modules.get(_DYNAMO)
    return module is not None and not getattr(module.__spec__, "_initializing", False)


def _when_dynamo(tell: Callable[[], None]) -> None:
    """Call ``tell`` now where Dynamo is imported, else as soon as it is."""
    with _told:
        if not _dynamo_ready():
            _pending.append(tell)
            if not any(isinstance(f, _OnDynamoImport) for f in sys.meta_path):
                sys.meta_path.insert(0, _OnDynamoImport())
            return
    _tell_pending()  # (where Dynamo's loader could not be wrapped: at the next call)
    tell()


def _tell_pending() -> None:
    with _told:
        calls, _pending[:] = list(_pending), []
    for tell in calls:
        try:
            tell()
        except Exception:  # noqa: BLE001 - never fail the import of Dynamo over a mark
            logger.debug("Dynamo could not be told of a frame of ours", exc_info=True)


class _OnDynamoImport(importlib.abc.MetaPathFinder):
    """Tells Dynamo what is pending once its package is imported, before anything compiles."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _DYNAMO:
            return None
        sys.meta_path.remove(self)  # (the other finders find it)
        spec = importlib.util.find_spec(name)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec  # pragma: no cover - another loader: told at the next skip_frame
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _tell_pending()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _table() -> Any:
    """Dynamo's table of code it runs as it is (``skip_code``, torch 2.1 to 2.14 at least),
    looked up once Dynamo is imported; None where it is missing (logged once)."""
    global _skip_code
    if _skip_code is None:
        found = getattr(sys.modules.get(_DYNAMO + ".eval_frame"), "skip_code", None)
        ok = private.probe("skip_code", lambda: None if found else "is missing")
        _skip_code = found if ok else False
    return _skip_code or None


def _stock_probe() -> Callable[[], bool]:
    """torch's own tracing-state function: ``torch.compiler.is_compiling`` where Dynamo
    folds it (its table says so), else ``torch._dynamo.external_utils.is_compiling``."""
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


def compiling_probe() -> Callable[[], bool]:
    """The "is Dynamo tracing this code?" function of this torch version: ``True`` while
    Dynamo traces the caller, ``False`` eagerly. Steps and hooks return at once under
    tracing: Dynamo cannot trace their bookkeeping (older versions fail with an internal
    error instead of breaking the graph).

    torch's own (``torch.compiler.is_compiling``) folds to ``True`` too, but Dynamo then marks
    the frame as one whose eager run differs from its trace, and compiles it even where its
    graph is empty, a frame it otherwise runs eagerly: our optimizer hook in a compiled
    optimizer step changed what Dynamo compiled so. This probe is a function Dynamo calls at
    trace time and takes the result of as a constant (``torch.compiler.assume_constant_result``:
    no guard, no mark): whether Dynamo's tracing context is set on this thread (a
    dict lookup eagerly, as cheap as torch's). torch's own where either is missing or its
    canary (:mod:`..native.private`) fails.
    """
    try:
        from torch._guards import _TLS, TracingContext, tracing
    except ImportError:  # pragma: no cover - another torch: its own probe
        _TLS = None
    assume_constant_result = getattr(torch.compiler, "assume_constant_result", None)

    def compiling() -> bool:
        """Whether Dynamo is tracing the caller (its tracing context is set)."""
        # (the thread's own dict: getattr with a default is slower where the attribute is
        # unset, docs/performance.md)
        return _TLS.__dict__.get("tracing_context") is not None

    def canary() -> Optional[str]:  # False eagerly, True under a tracing context
        if _TLS is None or assume_constant_result is None:
            return "is missing"
        if compiling():
            return "reads True outside a trace"
        with tracing(TracingContext(None)):
            inside = compiling()
        return None if inside else "reads False inside a trace"

    if not private.probe("tracing", canary):
        return _stock_probe()
    skip_frame(compiling)  # run eagerly inside a compiled call (after a graph break)

    def constant() -> None:  # (it imports Dynamo: told once Dynamo is imported)
        if assume_constant_result(compiling) is not compiling:  # pragma: no cover - a wrapper
            private.probe("tracing", lambda: "is wrapped by assume_constant_result")

    _when_dynamo(constant)
    return compiling


def skip_frame(fn: Callable) -> Callable:
    """Mark ``fn``'s code so that Dynamo runs its frames as they are and compiles the frames
    they call (``torch._dynamo.eval_frame.skip_code``: torch 2.1 to 2.14 at least); returns
    ``fn``. Where this torch has no such call, nothing is marked (:mod:`..native.private` logs it).
    Dynamo still inlines a marked function into a frame it traces: what it calls is read
    first through :data:`compiling`. Before Dynamo is imported, the mark waits for it."""
    code = fn.__code__

    def mark() -> None:
        skip_code = _table()
        if skip_code is not None:
            try:
                skip_code(code)
            except Exception as exc:  # noqa: BLE001 - another signature: the code stays traceable
                why = f"failed ({type(exc).__name__}: {exc})"
                private.probe("skip_code", lambda: why)

    _when_dynamo(mark)
    return fn


def run_eagerly(fn: Callable) -> Callable:
    """``fn`` wrapped so that Dynamo neither compiles nor is offered its frames, nor those of
    what it calls (``torch.compiler.disable``, recursive); ``fn`` itself where this torch has
    no Dynamo. Only for code that runs outside a trace: traced, the wrapper breaks the graph."""
    disable = getattr(torch.compiler, "disable", None)
    return fn if disable is None else disable(fn, recursive=True)


#: This torch's "is Dynamo tracing the caller?" (:func:`compiling_probe`).
compiling = compiling_probe()


def _inside_compiled_probe() -> Callable[[], bool]:
    """:func:`inside_compiled` of this torch: Dynamo's frame callback is set (a callable)
    while a compiled function or module runs; ``None`` (eager, or ``set_stance("force_eager")``)
    or ``False`` (run cached code only) otherwise. Before torch 2.5 there is no getter: the
    callback is read by setting none and putting it back (what ``torch._dynamo.disable``
    does around a call)."""
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
    except ImportError:  # torch < 2.5
        frames = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
        set_eval_frame = getattr(frames, "set_eval_frame", None)  # (not importable by name)
        if set_eval_frame is None:  # pragma: no cover - a torch without Dynamo
            return lambda: False

        def get_eval_frame_callback() -> Any:
            callback = set_eval_frame(None)
            set_eval_frame(callback)
            return callback

    def inside_compiled() -> bool:
        """Whether this eager code runs inside a compiled call (Dynamo's callback is set)."""
        if compiling():  # traced (Dynamo inlines marked frames too): a constant, no break
            return True
        callback = get_eval_frame_callback()
        return callback is not None and callback is not False

    def canary() -> Optional[str]:  # (True inside a compiled call: tests/test_compiled.py)
        return "reads True outside a compiled call" if inside_compiled() else None

    if not private.probe("eval_frame", canary):
        return lambda: False
    return skip_frame(inside_compiled)  # (its frame is not offered to Dynamo: see skip_frame)


#: Whether eager code runs inside a compiled call: after a graph break in a compiled module
#: or function, Dynamo compiles each frame it calls (:func:`_inside_compiled_probe`). A layer
#: takes its plain path there, so Dynamo compiles the stock code's frames as it would.
inside_compiled = _inside_compiled_probe()


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
    """At trace time (``comptime``): note the layer being traced (``traced``'s ``layer``);
    from then on, graph breaks are attributed as Dynamo compiles (:func:`.breaks.watch`)."""
    try:
        breaks.watch()
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
    """Note ``layer`` as traced into a compiled graph, with the Dynamo compilation and the
    compiled call under way (:data:`owner`); call it only while Dynamo traces. It runs at
    trace time through ``torch._dynamo.comptime``: no guard, no graph break, nothing in the
    graph."""
    try:  # torch 2.0+: a function Dynamo calls at trace time with its context (imported, as
        from torch._dynamo.comptime import comptime  # Dynamo is tracing)
    except ImportError:  # pragma: no cover - a torch without Dynamo
        return
    comptime(_note)


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
    breaks.forget()


def describe() -> Optional[Dict[str, Any]]:
    """What ran compiled, for a summary (None when nothing of ours was traced and Dynamo
    recorded no graph break nor recompile): ``owners``, per step name of a compiled call
    (``""``: none was known, the calls were not counted): ``layers``, per scope its class,
    its calls per compiled call and whether that is ``exact`` (every compilation of the
    call traced it as often, none resumed after a graph break) or estimated (the most of
    any; a layer only :func:`listed`: one); ``breaks``: :func:`.breaks.graph_breaks`;
    ``recompiles``: :func:`.breaks.recompiles`."""
    with _lock:
        traces = {k: Counter(v) for k, v in _traces.items()}
        classes = dict(_classes)
        listed_ = {k: dict(v) for k, v in _listed.items()}
    found, again = breaks.graph_breaks(), breaks.recompiles()
    if not traces and not found and not listed_ and not again:
        return None
    owners: Dict[str, Dict[str, Any]] = {}
    by_owner: Dict[str, List[Tuple[str, Counter]]] = {}
    for (name, _, root), counts in sorted(traces.items()):
        by_owner.setdefault(name, []).append((root, counts))
    for name, comps in by_owner.items():
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
        owners[name] = {"compilations": len(comps), "layers": layers}
    for name, tree in listed_.items():
        layers = owners.setdefault(name, {"compilations": 0, "layers": {}})["layers"]
        for scope, cls in tree.items():
            layers.setdefault(scope, {"class": cls, "per_call": 1, "exact": False})
    return {"owners": owners, "breaks": found, "recompiles": again}
