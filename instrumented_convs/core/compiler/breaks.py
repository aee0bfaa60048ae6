"""Graph breaks and recompiles Dynamo recorded, each blamed on the conv layer (and line) whose
code caused it.

The layer is the innermost conv frame on the break's traced stack; where none is (a frame
Dynamo compiled on its own after an earlier break), a compile-start callback (torch 2.5+)
names the eager conv frame under that compilation.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

__all__ = ["graph_breaks", "recompiles", "watch", "forget"]

logger = logging.getLogger(__name__)

#: The conv modules whose classes are layers (their source files are searched).
_PACKAGES = ("torch_geometric.nn.conv", "dgl.nn.pytorch.conv")

_lock = threading.Lock()
#: (graph break reason, the eager conv frame under its compilation): attributed at compile
#: time; the reason object is kept (its id is then never reused).
_eager: List[Tuple[Any, Dict[str, Any]]] = []
_started = threading.local()
_sources: Dict[str, List[Tuple[int, int, str]]] = {}
_known = -1  # how many conv modules _sources was built from


def _reasons() -> Optional[list]:
    try:
        from torch._dynamo.utils import graph_break_reasons
    except ImportError:  # pragma: no cover - a torch without Dynamo
        return None
    return graph_break_reasons


def _conv_sources() -> Dict[str, List[Tuple[int, int, str]]]:
    """Source file -> (first line, last line, class name) of each conv class imported
    (rebuilt when the number of conv modules changed)."""
    global _known
    modules = [m for k, m in list(sys.modules.items()) if k.startswith(_PACKAGES) and m]
    if _known == len(modules):
        return _sources
    found: Dict[str, List[Tuple[int, int, str]]] = {}
    for module in modules:
        for value in list(vars(module).values()):
            if not isinstance(value, type) or value.__module__ != module.__name__:
                continue
            if not issubclass(value, torch.nn.Module):  # (a generated module's NamedTuple)
                continue
            try:
                lines, first = inspect.getsourcelines(value)
                path = os.path.realpath(inspect.getsourcefile(value) or "")
            except (OSError, TypeError):
                continue
            found.setdefault(path, []).append((first, first + len(lines) - 1, value.__name__))
    with _lock:
        _sources.clear()
        _sources.update(found)
        _known = len(modules)
    return _sources


def _layer_at(
    sources: Dict[str, List[Tuple[int, int, str]]], filename: str, line: int
) -> Optional[str]:
    """The conv class whose source holds ``filename:line`` (``sources``: :func:`_conv_sources`);
    a module-level helper of a file with one conv class is that class's; else None."""
    classes = sources.get(os.path.realpath(filename))
    if not classes:
        generated = _GENERATED.match(os.path.basename(filename))  # PyG's propagate, made
        return generated.group(1) if generated else None  # from the class (a temp file)
    for first, last, name in classes:
        if first <= line <= last:
            return name
    return classes[0][2] if len({name for _, _, name in classes}) == 1 else None


#: The temporary module PyG writes a layer's ``propagate`` to (from its class): the class.
_GENERATED = re.compile(
    r"(?:torch_geometric\.nn\.conv\.\w+|instrumented_convs\.pyg)_(\w+?)_propagate_\w+\.py"
)
#: The files a conv layer's code may be in: the frameworks' conv packages, PyG's generated
#: ``propagate`` modules.
_CONV_PATH = re.compile(r"nn[/\\](?:pytorch[/\\])?conv[/\\]|_propagate_\w+\.py$")
#: A recompile's reason: the compiled version (frame/version) whose guard failed, and why.
_COMPILE_ID = re.compile(r"\[?(\d+/\d+(?:_\d+)?)\]?: (.*)")
#: Numbers in a recompile's reason (sizes, ids): one place, one reason.
_NUMBERS = re.compile(r"\d+")
#: Dynamo's name of the code that resumes ``forward`` after a graph break at a line.
_RESUMED = re.compile(r"torch_dynamo_resume_in_(\w+?)_at_\d+")


def _place(filename: str, line: int, function: str) -> Dict[str, Any]:
    """File (base name), line and function (its own name where Dynamo resumed it)."""
    resumed = _RESUMED.fullmatch(function)
    function = resumed.group(1) if resumed else function
    name = os.path.basename(filename)
    generated = _GENERATED.match(name)
    if generated:  # (a temporary file's name: named for the class instead)
        name = f"<{generated.group(1)} propagate>"
    return {"file": name, "line": line, "function": function}


def _eager_layer() -> Optional[Dict[str, Any]]:
    """The innermost eager frame of a conv layer's code on this thread's stack, or None."""
    frame, candidates = sys._getframe(2), []
    while frame is not None:  # (the sources are read only where a frame may be a layer's)
        if _CONV_PATH.search(frame.f_code.co_filename):
            candidates.append(frame)
        frame = frame.f_back
    sources = _conv_sources() if candidates else {}
    for frame in candidates:
        code = frame.f_code
        layer = _layer_at(sources, code.co_filename, code.co_firstlineno)
        if layer is not None:
            return {"layer": layer, **_place(code.co_filename, frame.f_lineno, code.co_name)}
    return None


def _on_start(args: Any) -> None:
    """Dynamo starts compiling a frame: note how many breaks it knew, and the conv layer
    under way eagerly (None: none)."""
    try:
        reasons = _reasons()
        _started.at = (len(reasons), _eager_layer()) if reasons is not None else None
    except Exception:  # noqa: BLE001 - never fail a user's compilation over a note
        _started.at = None
        logger.debug("graph break attribution: compile start not noted", exc_info=True)


def _on_end(args: Any) -> None:
    """Dynamo ended compiling a frame: its new breaks get the eager layer noted at start."""
    at, _started.at = getattr(_started, "at", None), None
    reasons = _reasons()
    if at is None or at[1] is None or reasons is None:
        return
    with _lock:
        _eager.extend((r, at[1]) for r in list(reasons[at[0] :]))


def watch() -> bool:
    """Register the compile callbacks (once; torch 2.5+); whether they are registered.
    Called by ``run`` as it starts and by a layer of ours as Dynamo first traces it: never
    at import."""
    if getattr(watch, "done", None) is not None:
        return watch.done  # type: ignore[attr-defined]
    try:
        from torch._dynamo import disable
        from torch._dynamo.callback import callback_handler

        # (a frame compiled inside a compiled call: Dynamo is offered none of theirs)
        callback_handler.register_start_callback(disable(_on_start, recursive=True))
        callback_handler.register_end_callback(disable(_on_end, recursive=True))
        watch.done = True  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        watch.done = False  # type: ignore[attr-defined]
    return watch.done  # type: ignore[attr-defined]


def forget() -> None:
    """Forget the attributions made at compile time (with Dynamo's reasons cleared)."""
    with _lock:
        _eager.clear()


def graph_breaks() -> List[Dict[str, Any]]:
    """The graph breaks Dynamo recorded in this process: {reason, layer, file, line,
    function, via}: ``layer`` the conv class whose code caused it (None: none did, as far as
    the stacks tell) and where in that code; ``via``: the innermost frame Dynamo traced
    (file, line, function), where that is not the layer's own line."""
    reasons = _reasons()
    if not reasons:
        return []
    with _lock:
        eager = {id(r): where for r, where in _eager}
    out, sources = [], _conv_sources()
    for r in [r for r in list(reasons) if getattr(r, "graph_break", True)]:
        stack = list(getattr(r, "user_stack", None) or [])
        where: Dict[str, Any] = {"layer": None, "file": None, "line": None, "function": None}
        for frame in reversed(stack):
            layer = _layer_at(sources, frame.filename, frame.lineno)
            if layer is not None:
                where = {"layer": layer, **_place(frame.filename, frame.lineno, frame.name)}
                break
        else:
            where = dict(eager.get(id(r)) or where)
        inner = stack[-1] if stack else None
        via = inner and _place(inner.filename, inner.lineno, inner.name)
        if via and (via["file"], via["line"]) == (where["file"], where["line"]):
            via = None
        reason = str(getattr(r, "reason", r)).strip().splitlines()[0][:200]
        out.append({"reason": reason, **where, "via": via})
    return out


def recompiles() -> List[Dict[str, Any]]:
    """Dynamo's recompiles in this process (``torch._dynamo.utils.guard_failures``: per code
    compiled again, the guard that failed, one each time): {reason (its numbers as N),
    layer, file, line, function}, ``layer`` the conv class whose code was recompiled (None:
    not a conv layer's)."""
    try:
        from torch._dynamo.utils import guard_failures
    except ImportError:  # pragma: no cover - a torch without Dynamo
        return []
    if not guard_failures:
        return []
    out, sources = [], _conv_sources()
    for code, reasons in list(guard_failures.items()):
        filename, line = getattr(code, "co_filename", ""), getattr(code, "co_firstlineno", 0)
        layer = _layer_at(sources, filename, line)
        where = {"layer": layer, **_place(filename, line, getattr(code, "co_name", "?"))}
        # A recompile notes why each compiled version of the code failed its guards
        # ("6/2: tensor 'x' size mismatch ..."): one recompile a version, its first reason.
        first: Dict[str, str] = {}
        for reason in list(reasons):
            text = (str(reason).strip() or "?").splitlines()[0]
            found = _COMPILE_ID.match(text)
            version, why = found.groups() if found else (text, text)
            first.setdefault(version, why.split("; ")[0])
        out += [{"reason": _NUMBERS.sub("N", why)[:200], **where} for why in first.values()]
    return out
