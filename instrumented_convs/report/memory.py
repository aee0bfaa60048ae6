"""The memory table (``configure(memory=True)``; ``summary.table(memory=True)``): per step,
what it keeps for backward and how high the bytes alive rise while it runs, and its part of
a diff. It only renders rows.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from ..core.storage.entry import BACKWARD_MARK
from .columns import bytes_text, grid, recorded_memory

__all__ = ["render", "rows_of", "verdict", "diff_text"]


def rows_of(summary: Any) -> List[Any]:
    """The rows the memory table shows: those of ``summary`` that memory recorded."""
    return [r for r in summary.rows if recorded_memory([r])]


def render(summary: Any, title: str = "Memory") -> str:
    """The memory table of ``summary``.

    For each step that memory recorded (children included, as its time): its calls, the bytes of
    the tensors it made that autograd kept for backward, per call, and their share of what the
    whole forward kept (the top-level rows' sum: the model's activation memory, split by step),
    and its peak (the most bytes alive above a call's start, the largest of its calls; a
    backward step's: what its backward allocates at its peak). What memory cannot see is said
    under the table.
    """
    rows = rows_of(summary)
    if not rows:
        return f"--- {title}: nothing recorded (configure(memory=True) records it)"
    kept = sum(r.saved_bytes for r in rows if r.depth == 0 and r.phase == "forward")
    head = ["Count", "Saved/call", "% saved", "Peak"]
    labels, scope_at = [], {}  # depth -> the scope of the last row there
    for r in rows:
        outer = scope_at.get(r.depth - 1) if r.depth else None
        scope_at[r.depth] = r.scope
        layer = f" ({r.scope})" if r.scope and r.scope != outer else ""  # a layer's own row
        mark = BACKWARD_MARK if r.phase == "backward" else ""
        labels.append(("  " * r.depth) + "- " + r.step + mark + layer)
    cells = []
    for r in rows:
        forward = r.phase == "forward"
        cells.append(
            [
                str(r.count),
                bytes_text(r.saved_bytes / max(r.count, 1)) if forward else "-",
                f"{100 * r.saved_bytes / kept:.1f}" if forward and kept else "-",
                bytes_text(r.peak_bytes) if r.mem_calls else "-",
            ]
        )
    lines = grid(f"--- {title}: kept for backward {bytes_text(kept)} in all", head, labels, cells)
    lines.append(
        "Saved/call: bytes of the tensors a step made (its children's included) that "
        "autograd kept for backward, per call (a storage counts once, to the step that made "
        "it; the data, the parameters and what was made outside steps count nothing); % "
        "saved: its share of what the top-level steps kept. Peak: the most bytes alive above "
        "a call's start, the largest of its calls, read after each op: on CUDA the "
        "allocator's memory_allocated, on the CPU the tensors that ops made in steps (not an "
        "op's own scratch buffers, nor tensors made outside steps)."
    )
    aside = [r for r in rows if r.saved_aside]
    if aside:
        lines.append(
            "Under your own saved-tensor hooks (set after memory was turned on: save_on_cpu, "
            "checkpoint), what was saved is not seen: "
            + ", ".join(
                f"{r.name}{BACKWARD_MARK if r.phase == 'backward' else ''} ({r.saved_aside} calls)"
                for r in aside
            )
            + "."
        )
    return "\n".join(lines)


def verdict(a: Optional[float], b: Optional[float], min_change: float) -> str:
    """The verdict on a memory figure that went from ``a`` to ``b`` bytes: ``more`` or
    ``less`` by ``min_change`` (a share of ``a``) or more, else ``unchanged`` (memory is
    counted, not timed: no noise to weigh); ``added``/``missing`` where a side has none."""
    if a is None or b is None:
        return "added" if a is None else "missing"
    if a == b or (a and abs(b - a) < min_change * a):
        return "unchanged"
    return "more" if b > a else "less"


def diff_text(pairs: Sequence[Any], min_change: float) -> str:
    """The memory part of a diff (``pairs``: its rows, with ``a`` and ``b``): per step that
    either run recorded memory for, what it keeps per call and its peak in each run, the
    change and a verdict for each (:func:`verdict`); "" when neither recorded any."""
    shown = [d for d in pairs if any(r is not None and recorded_memory([r]) for r in (d.a, d.b))]
    if not shown:
        return ""

    def saved(r: Any) -> Optional[float]:
        if r is None or not recorded_memory([r]) or r.phase != "forward":
            return None
        return r.saved_bytes / r.count if r.count else 0.0

    def peak(r: Any) -> Optional[float]:
        return r.peak_bytes if r is not None and r.mem_calls else None

    head = ["a saved", "b saved", "change", "verdict", "a peak", "b peak", "change", "verdict"]
    labels, cells = [], []
    for d in shown:
        labels.append(
            "  " * d.depth + "- " + d.step + (BACKWARD_MARK if d.phase == "backward" else "")
        )
        row = []
        for get in (saved, peak):
            a, b = get(d.a), get(d.b)
            if a is None and b is None:
                row += ["-", "-", "", ""]
                continue
            change = (
                "" if a is None or b is None else ("+" if b >= a else "-") + bytes_text(abs(b - a))
            )
            row += [
                "-" if a is None else bytes_text(a),
                "-" if b is None else bytes_text(b),
                change,
                verdict(a, b, min_change),
            ]
        cells.append(row)
    lines = grid("--- memory: kept for backward per call, and peak", head, labels, cells)
    lines.append(
        f"more/less: a change of {100 * min_change:g}% or more of a's bytes (memory is counted, "
        "not timed: exact on the CPU, the allocator's on CUDA); unchanged: less."
    )
    return "\n".join(lines)
