"""What a summary says of ``torch.compile`` (:func:`compiled_note`): the layers that ran
compiled, graph breaks and recompiles, since steps do not record inside compiled code and a
layer that ran compiled must never be a silent gap.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Optional

__all__ = ["compiled_note", "eager_breakdown", "layer_calls", "unscaled"]


def eager_breakdown(sampling: Optional[Dict[str, Any]]) -> bool:
    """Whether a run's recorded iterations ran eagerly (``configure(compiled="eager")``, on a
    torch that can): its other iterations ran compiled and recorded nothing."""
    return bool(((sampling or {}).get("eager") or {}).get("available"))


def unscaled(stats: List[Any], sampling: Optional[Dict[str, Any]]) -> List[Any]:
    """``stats`` (a registry snapshot) as a summary reads them: under the eager breakdown
    every entry weighs 1, since the unrecorded iterations ran compiled, not as the recorded
    ones did; the rows are the eager iterations' own, the compiled time stated beside."""
    if not eager_breakdown(sampling):
        return stats
    return [s._replace(weight=1.0) if s.weight != 1.0 else s for s in stats]


def _calls_of(summary: Any, name: str) -> Optional[float]:
    """The forward calls of the steps called ``name`` in ``summary``, wherever they are in
    the tree (None where it has no such row)."""
    counts = [r.count for r in summary.rows if r.step == name and r.phase == "forward"]
    return sum(counts) if counts else None


def layer_calls(summary: Any) -> List[Dict[str, Any]]:
    """One dict per (compiled call, layer): ``owner`` (the compiled call's step name, ``""``
    where none was known), ``scope``, ``class``, ``per_call``, ``exact``, and ``calls``: the
    owner's calls times ``per_call`` (None where the owner's calls were not counted)."""
    compiled = getattr(summary, "compiled", None) or {}
    out = []
    for owner, info in sorted(compiled.get("owners", {}).items()):
        owner_calls = _calls_of(summary, owner) if owner else None
        for scope, layer in sorted(info["layers"].items()):
            calls = None if owner_calls is None else owner_calls * layer["per_call"]
            out.append({"owner": owner, "scope": scope, **layer, "calls": calls})
    return out


#: Places named per layer in the note (the rest are counted).
_PLACES = 4


def _by_layer_text(events: List[Dict[str, Any]], what: str, title: str) -> str:
    """Per conv layer class: its graph breaks (or recompiles, ``what``), and the places in
    its code that caused them (the most first: count, file:line, function, reason, and the
    frame Dynamo broke in where that is not the layer's own line); then those outside conv
    layers."""
    per_layer: Dict[str, Counter] = {}
    outside: Counter = Counter()
    for b in events:
        if not b.get("layer"):
            outside[b["reason"]] += 1
            continue
        via = b.get("via")
        inside = f", inside {via['file']}:{via['line']} {via['function']}" if via else ""
        place = f"{b['file']}:{b['line']} in {b['function']} ({b['reason']}{inside})"
        per_layer.setdefault(b["layer"], Counter())[place] += 1
    parts = []
    for layer, places in sorted(per_layer.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(places.values())
        named = [f"{k} at {place}" for place, k in places.most_common(_PLACES)]
        if len(places) > _PLACES:
            named.append(f"{len(places) - _PLACES} more places")
        parts.append(f"{layer}: {n} {what}{'s' * (n != 1)}: " + "; ".join(named))
    if outside:
        n = sum(outside.values())
        parts.append(f"{n} outside conv layers ({outside.most_common(1)[0][0]}...)")
    return f"{title} (torch.compile): " + ". ".join(parts) + "."


def compiled_note(summary: Any) -> str:
    """The lines a summary adds about compiled code (empty when nothing ran compiled).

    A summary carries what the core noted while Dynamo traced our layers
    (:func:`instrumented_convs.core.compiler.dynamo.describe`, the summary's ``compiled``): per
    compiled call (``run``'s ``compiled NAME`` step), the conv layers traced into its graphs and
    how many times each runs in one call; the graph breaks Dynamo recorded, attributed to the
    conv layers whose code caused them, and the recompiles, to those whose code was compiled
    again. :func:`compiled_note` turns that into the lines under the table and on the page: a
    layer that ran compiled is never a silent gap.
    """
    compiled = getattr(summary, "compiled", None)
    if not compiled:
        return ""
    counted, uncounted, estimated = [], [], False
    eager = eager_breakdown(getattr(summary, "sampling", None))
    for owner, info in sorted(compiled.get("owners", {}).items()):
        if eager and owner:  # the eager breakdown: their steps are in the table
            continue
        layers = sorted(info["layers"].items())
        if not owner:
            uncounted.extend(f"{v['class']} {scope}" for scope, v in layers)
            continue
        calls = _calls_of(summary, owner)
        parts = []
        for scope, v in layers:
            estimated = estimated or not v["exact"]
            n = "?" if calls is None else f"{'' if v['exact'] else '~'}{calls * v['per_call']:g}"
            parts.append(f"{v['class']} {scope} {n}")
        parts_text = ", ".join(parts)
        counted.append(f"in {owner} ({'?' if calls is None else f'{calls:g}'} calls): {parts_text}")
    texts = []
    if counted:
        texts.append(
            "Ran compiled, not broken down (calls: the compiled call's, times the layer's calls "
            "in its compiled graphs): "
            + "; ".join(counted)
            + "."
            + (
                " ~: estimated: the graphs differ or a graph break split one (the most "
                "taken), or the layer was not traced by us (one a call, from the module tree)."
                if estimated
                else ""
            )
        )
    if uncounted:
        texts.append(
            "Ran compiled, not broken down, calls not counted (compiled outside `run`): "
            + ", ".join(uncounted)
            + ". `python -m instrumented_convs run` times each compiled call; "
            'configure(compiled="eager") gives their steps from iterations run eagerly.'
        )
    if compiled.get("breaks"):
        texts.append(_by_layer_text(compiled["breaks"], "graph break", "Graph breaks"))
    if compiled.get("recompiles"):  # (a compiled frame's guard failed: compiled again)
        texts.append(_by_layer_text(compiled["recompiles"], "recompile", "Recompiles"))
    return " ".join(texts)
