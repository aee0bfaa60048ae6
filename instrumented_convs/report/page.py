"""A run as one self-contained HTML page: icicle, table, per-rank spread, a diff side by side.

One file that works offline and shows where the time went at a glance, with nothing in a
name or a path able to break it. It only renders: it reads summaries by their attributes
and imports nothing above :mod:`.text`.
"""

from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import columns, hostdevice
from .compiled import compiled_note
from .text import sampling_note

__all__ = ["summary_page", "diff_page", "embed", "in_notebook", "FALLBACK_CLASS"]

_ASSETS = Path(__file__).with_name("page_assets")
#: What the icicle and its tooltips read of a row (the table's cells come from the spec).
_ROW_FIELDS = (
    "name",
    "step",
    "depth",
    "scope",
    "kind",
    "phase",
    "count",
    "total",
    "self_time",
    "mean",
    "estimated",
    "host",
    "device_calls",
)
_RANK_DEPTH = 2  # the per-rank table shows the steps down to this depth


def embed(data: Any) -> str:
    """``data`` as JSON safe inside an HTML ``<script>`` element (no ``<``, ``>``, ``&``)."""
    text = json.dumps(data, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _run(label: str, rows: Sequence[Any], unit: str, world: Optional[int]) -> Dict[str, Any]:
    """One run's part of the page's data: its rows for the icicle, and its table as the text
    table has it (:mod:`.columns`: the same columns, cells and unit, stated in the headers;
    a sampled run's standard errors too)."""
    scale = dict(columns.UNITS)[unit]
    shown = columns.shown(
        world is not None,
        sampled=any(r.sampled for r in rows),
        memory=columns.recorded_memory(rows),
        device=columns.timed_on_device(rows),
        rows=rows,
    )
    timed = ("time", "slowest", "error")
    headers = [c.header + (f" ({unit})" if c.kind in timed else "") for c in shown]
    return {
        "label": label,
        "unit": unit,
        # by relation: the rows' group column is their relation (see _rows)
        "relations": any(r.scope is None and r.relation is not None for r in rows),
        "rows": _rows(rows),
        "columns": headers,
        "cells": [[columns.cell(c, r, scale, world) for c in shown] for r in rows],
    }


def _rows(rows: Sequence[Any]) -> List[Dict[str, Any]]:
    out = []
    for row in rows:
        d = dataclasses.asdict(row)
        if d["scope"] is None and d["relation"] is not None:  # by relation: the row's group
            d["scope"] = d["relation"]
        out.append({k: _finite(d[k]) for k in _ROW_FIELDS})
    return out


def _memory(rows: Sequence[Any]) -> Optional[List[Dict[str, Any]]]:
    """The forward rows of a run that recorded memory, for the icicle by bytes: ``total``
    what a row kept for backward in all its calls (its children's included: widths add
    up), ``self_time`` its own part of it, ``mean`` per call, ``peak`` its peak; None when
    memory was not recorded."""
    if not columns.recorded_memory(rows):
        return None
    forward = [r for r in rows if r.phase == "forward"]
    own = [float(r.saved_bytes) for r in forward]
    last: Dict[int, int] = {}  # depth -> index of the latest row at that depth
    for i, r in enumerate(forward):  # rows in tree order: a row's parent is the last one up
        last[r.depth] = i
        p = last.get(r.depth - 1)
        if r.depth > 0 and p is not None and forward[p].name == r.parent:
            own[p] -= r.saved_bytes
    out = []
    for r, mine in zip(forward, own):
        d = {k: _finite(getattr(r, k)) for k in _ROW_FIELDS}
        per_call = r.saved_bytes / r.count if r.count else 0.0
        d.update(total=r.saved_bytes, mean=per_call, self_time=max(mine, 0.0), peak=r.peak_bytes)
        out.append(d)
    return out


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")) else v


def _ranks(summary: Any) -> Optional[Dict[str, Any]]:
    """Each rank's total per step (depth <= 2) of a summary merged over ranks, else None."""
    if summary.world_size is None:
        return None
    parts = summary.by_rank()
    totals = [{r.key: r.total for r in part.rows} for part in parts]
    rows = []
    for r in summary.rows:
        if r.depth > _RANK_DEPTH:
            continue
        key = r.key
        rows.append(
            {
                "name": r.name,
                "step": r.step,
                "depth": r.depth,
                "phase": r.phase,
                "totals": [t.get(key) for t in totals],
                "spread": _finite(r.spread),
            }
        )
    return {"ranks": list(range(len(parts))), "rows": rows}


#: The class of the text table beside a page in a notebook (hidden once the page drew).
FALLBACK_CLASS = "instrumented-convs-text"
# Run in the page once drawn (its srcdoc shares the notebook's origin): hide the text table
# beside the frame and fit the frame to the page. Where a viewer strips scripts or frames,
# neither happens and the text table is what shows.
_FIT = (
    "<script>addEventListener('load',function(){try{var f=window.frameElement;if(!f)return;"
    "var t=f.nextElementSibling;if(t&&t.className==='" + FALLBACK_CLASS + "')"
    "t.style.display='none';f.style.height=(document.documentElement.scrollHeight+24)+'px';"
    "}catch(e){}});</script>\n"
)


def in_notebook(document: str, text: str) -> str:
    """A page as a notebook's HTML output: inside an iframe's ``srcdoc``, so that its script
    and styles and the notebook's cannot touch each other, followed by ``text`` (the table)
    in a ``<pre>``: the page hides it and fits its frame to itself once drawn; a viewer that
    strips scripts or frames (a static notebook viewer) shows the text table instead."""
    document = document.replace("</body>", _FIT + "</body>", 1)
    return (
        f'<iframe srcdoc="{html.escape(document, quote=True)}" title="instrumented_convs" '
        'style="width:100%;height:640px;border:0"></iframe>'
        f'<pre class="{FALLBACK_CLASS}">{html.escape(text)}</pre>'
    )


def _document(title: str, data: Dict[str, Any]) -> str:
    css = (_ASSETS / "page.css").read_text()
    js = (_ASSETS / "page.js").read_text()
    if "</script" in js.lower() or "</style" in css.lower():
        raise RuntimeError("page assets must not close their own element")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n{css}</style>\n</head>\n<body>\n"
        '<div id="main"></div>\n<pre id="errors"></pre>\n'
        f'<script type="application/json" id="data">{embed(data)}</script>\n'
        f"<script>\n{js}</script>\n</body>\n</html>\n"
    )


def summary_page(
    summary: Any,
    title: str = "instrumented_convs",
    subtitle: Optional[str] = None,
    meta: Sequence[Tuple[str, Any]] = (),
    note: str = "",
    loaders: Optional[Sequence[Dict[str, Any]]] = None,
    advice: Optional[Sequence[Dict[str, Any]]] = None,
) -> str:
    """The page of one summary: its icicle, table and (merged over ranks) per-rank totals.

    ``meta``: ``(label, value)`` pairs shown under the title (command, versions, device);
    ``loaders``: the data loaders' split (:func:`.loaders.pipeline`), drawn per loader;
    ``advice``: what to change (:mod:`.rules`' items; None: the run was not advised).

    The page works offline: its style and script (``page_assets/page.css``, ``page.js``) are
    inlined, and the numbers travel as JSON in a ``<script type="application/json">`` element,
    with ``<``, ``>`` and ``&`` written as JSON escapes so that nothing in a step's name, a
    command line or a path can close the element (``</script>``) or open markup. The script
    draws an icicle of the step tree (forward steps blue, backward orange, the loop's regions
    grey; width is total time, hover for numbers, click to zoom), for a run that recorded memory
    a second icicle of the forward steps whose width is what each kept for backward, the summary
    table, the ranks' totals side by side for a run merged over ranks, and for a diff the two
    runs' icicles on one scale with the change per step. It sets ``data-ready="1"`` on
    ``<body>`` when drawn and ``data-errors`` to the number of script errors (shown on the page
    too): the tests open it in headless Chromium and read both.
    """
    data = {
        "title": title,
        "subtitle": subtitle,
        "meta": [[str(k), str(v)] for k, v in meta],
        "runs": [
            _run(
                title,
                summary.rows,
                columns.unit_of(summary.rows, summary.unit)[0],
                summary.world_size,
            )
        ],
        "ranks": _ranks(summary),
        "loaders": list(loaders) if loaders else None,
        "memory": _memory(summary.rows),
        "diff": None,
        "host_device": hostdevice.lines(summary) or None,
        "advice": None if advice is None else list(advice),
        "note": " ".join(
            filter(None, [sampling_note(summary.sampling), compiled_note(summary), note])
        ),
    }
    return _document(title, data)


def diff_page(
    result: Any,
    a: Any,
    b: Any,
    labels: Tuple[str, str] = ("A", "B"),
    title: Optional[str] = None,
    meta: Sequence[Tuple[str, Any]] = (),
) -> str:
    """The page of a diff: both runs' icicles on one scale, the change per step, both tables.

    ``result`` is ``a.diff(b)`` (a :class:`~instrumented_convs.report.SummaryDiff`); ``a``
    or ``b`` None (a diff made from its rows alone): that run's rows as the pairs hold them.
    """
    rows_a = a.rows if a is not None else [d.a for d in result.rows if d.a is not None]
    rows_b = b.rows if b is not None else [d.b for d in result.rows if d.b is not None]
    unit = columns.unit_of([*rows_a, *rows_b], result.unit)[0]
    rows = []
    for d in result.rows:
        rows.append(
            {
                "name": d.name,
                "step": d.step,
                "depth": d.depth,
                "phase": d.phase,
                "a_mean": None if d.a is None else d.a.mean,
                "b_mean": None if d.b is None else d.b.mean,
                "change": d.change,
                "relative": d.relative,
                "verdict": d.verdict,
            }
        )
    title = title or f"{labels[0]} -> {labels[1]}"
    data = {
        "title": title,
        "subtitle": f"the floor: {result.floor_text()}: smaller changes are unchanged",
        "meta": [[str(k), str(v)] for k, v in meta],
        "runs": [_run(labels[0], rows_a, unit, None), _run(labels[1], rows_b, unit, None)],
        "ranks": None,
        "diff": {"unit": unit, "labels": list(labels), "rows": rows},
        "note": "",
    }
    return _document(title, data)
