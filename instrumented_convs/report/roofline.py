"""The counters' table (``summary.table(counters=True, peak=...)``): per step its FLOPs,
bytes, intensity and achieved rates against the machine's roofline, so that a step can be
read as memory- or compute-bound. It only renders rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ..core.storage.entry import BACKWARD_MARK
from .columns import UNITS, choose_unit, grid

__all__ = ["Peak", "render", "rows_of", "roof", "as_peak"]


class Peak(NamedTuple):
    """A machine's limits: memory bandwidth and arithmetic throughput, and where they come
    from (a probe's description, or ``given``)."""

    gbs: float  #: bytes per second, in GB/s (10^9)
    gflops: float  #: FLOP per second, in GFLOP/s (10^9)
    source: str = "given"


def rows_of(summary: Any, times: Any = None) -> List[Any]:
    """The rows the counters' table shows: those of ``summary`` that counted ops, with the
    calls and times of ``times`` (a summary of a run without the counters; rows paired by
    path, phase and layer) and their FLOPs, bytes and memory per call, when given."""
    rows = [r for r in summary.rows if r.ops]
    if times is not None:
        timed = {t.key: t for t in times.rows}
        rows = [_retimed(r, timed.get(r.key)) for r in rows]
    return rows


def as_peak(peak: Any) -> Optional[Peak]:
    """``peak`` as a :class:`Peak`: one already, a ``(GB/s, GFLOP/s)`` pair, or None."""
    if peak is None or isinstance(peak, Peak):
        return peak
    return Peak(*peak)


def render(
    summary: Any,
    peak: Any = None,
    unit: Optional[str] = None,
    title: str = "Counters",
    times: Any = None,
) -> str:
    """The counters' table of ``summary`` (its rows with ``ops > 0``). ``peak``: a
    :class:`Peak` (or a ``(GB/s, GFLOP/s)`` pair) for the roof columns. ``times``: a summary
    of a run without the counters (they slow every op down) whose times and counts to use,
    with ``summary``'s FLOPs, bytes and memory per call (see :func:`rows_of`).

    For each step (all its calls, children included, as its time): GFLOP, MB moved (read +
    written), arithmetic intensity (FLOP per byte), the achieved GFLOP/s and GB/s over its
    measured time and, given the machine's peak (:class:`Peak`, from
    :func:`instrumented_convs.roofline.probe` or the user), the roof time, ``max(FLOP / peak
    FLOP/s, bytes / peak B/s)``, the time the step would take at the machine's limit; the bound
    it meets first (memory or compute); and ``x roof``, its measured time over its roof time
    (1.0: at the limit). Ops no formula knows are listed under the table with their counts,
    never folded in as zero.
    """
    peak = as_peak(peak)
    rows = rows_of(summary, times)
    if not rows:
        return f"--- {title}: nothing counted (configure(counters=True) counts the ops of steps)"
    title += (
        ", times from a run without them"
        if times is not None
        else (", times measured with the counters on")
    )
    if unit is not None:
        u, scale = unit, dict(UNITS)[unit]
    else:
        u, scale = choose_unit([r.total / max(r.count, 1) for r in rows])
    cuda = any(r.cuda_calls for r in rows)
    head = ["Count", "Time/call", "FLOP", "Bytes", "FLOP/B", "GFLOP/s", "GB/s"]
    if peak is not None:
        head += ["Bound", "Roof/call", "x roof"]
    head += ["Alloc"] + (["Left/call", "Peak"] if cuda else [])
    labels = [
        ("  " * r.depth) + "- " + r.step + (BACKWARD_MARK if r.phase == "backward" else "")
        for r in rows
    ]
    cells = [_cells(r, peak, scale, cuda) for r in rows]
    lines = grid(f"--- {title} (times in {u})", head, labels, cells)
    lines.append(
        "FLOP, Bytes: all calls of a step, its children's included (Bytes: read + "
        "written; k, M, G: 10^3, 10^6, 10^9); FLOP/B: their ratio; GFLOP/s, GB/s: over "
        "the step's measured time. Alloc: bytes of the tensors its ops allocated, all "
        "calls."
    )
    if cuda:
        lines.append(
            "Left/call: CUDA allocator bytes a call left allocated (after its last op less "
            "before its first); Peak: the most allocated above a call's start, read after "
            "each op (no synchronize; the user's max_memory_allocated untouched)."
        )
    if times is None:
        lines.append(
            "Times: of this run, slowed by the counters themselves (tens of us per op: "
            "docs/performance.md), so GFLOP/s, GB/s and x roof read slower than without "
            "them; times= (view --counters --times RUN) takes them from a run without."
        )
    if peak is not None:
        lines.append(
            f"Roof: the time at the machine's limit ({peak.gbs:.1f} GB/s, {peak.gflops:.1f} "
            f"GFLOP/s: {peak.source}), max(FLOP / peak FLOP/s, bytes / peak B/s); Bound: the "
            "limit met first; x roof: measured time / roof time."
        )
    for r, own in zip(rows, _own_unknown(rows)):
        if own:
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(own.items()))
            mark = BACKWARD_MARK if r.phase == "backward" else ""
            lines.append(f"{r.name}{mark}: no formula for {ops} (not in its FLOP and bytes)")
    return "\n".join(lines)


def roof(r: Any, peak: Peak) -> Tuple[float, str]:
    """Row ``r``'s roof time in seconds (all its calls) at ``peak``, and the bound it meets
    first (``memory`` or ``compute``)."""
    mem = (r.bytes_read + r.bytes_written) / (peak.gbs * 1e9)
    comp = r.flops / (peak.gflops * 1e9)
    return max(mem, comp), "memory" if mem >= comp else "compute"


def _cells(r: Any, peak: Optional[Peak], scale: float, cuda: bool) -> List[str]:
    moved, t, calls = r.bytes_read + r.bytes_written, r.total, max(r.count, 1)
    c = [
        str(r.count),
        f"{t / calls / scale:.3f}",
        _si(r.flops),
        _si(moved),
        f"{r.flops / moved:.3g}" if moved else "-",
        f"{r.flops / t / 1e9:.3g}" if t else "-",
        f"{moved / t / 1e9:.3g}" if t else "-",
    ]
    if peak is not None:
        time, bound = roof(r, peak)
        c += [bound, f"{time / calls / scale:.3f}", f"{t / time:.3g}" if time else "-"]
    c.append(_si(r.alloc_bytes))
    if cuda:
        left = f"{_si(r.cuda_left // r.cuda_calls)}" if r.cuda_calls else "-"
        c += [left, _si(r.cuda_peak) if r.cuda_calls else "-"]
    return c


def _retimed(r: Any, t: Any) -> Any:
    """Row ``r``'s FLOPs and bytes per call over the calls and time of row ``t`` (no time
    when the timed run has no such row)."""
    n = max(r.count, 1)
    calls, total = (t.count, t.total) if t is not None else (r.count, 0.0)
    return dataclasses.replace(
        r,
        count=calls,
        total=total,
        flops=r.flops * calls // n,
        bytes_read=r.bytes_read * calls // n,
        bytes_written=r.bytes_written * calls // n,
        alloc_bytes=r.alloc_bytes * calls // n,
    )


def _si(n: int) -> str:
    """``n`` with an SI prefix: ``25.6k``, ``3.2M``."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{prefix}"
    return str(int(n))


def _parse(text: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for item in filter(None, text.split(";")):
        op, n = item.rsplit(":", 1)
        out[op] = out.get(op, 0) + int(n)
    return out


def _own_unknown(rows: List[Any]) -> List[Dict[str, int]]:
    """Each row's unknown ops less its children's (rows hold their subtree's). A row's
    parent is the row before it one level up (rows are in tree order), whatever its layer:
    a region holding a layer's steps has none (``by="layer"``)."""
    own = [_parse(r.unknown) for r in rows]
    last: Dict[int, int] = {}  # depth -> index of the latest row at that depth
    for i, r in enumerate(rows):
        last[r.depth] = i
        p = last.get(r.depth - 1)
        if r.depth == 0 or p is None or rows[p].name != r.parent:
            continue
        for op, n in _parse(r.unknown).items():
            own[p][op] = own[p].get(op, 0) - n
    return [{op: n for op, n in d.items() if n > 0} for d in own]
