"""The roofline of a run's steps: the machine's limits, and a plot of the steps against them.

The counters (``configure(counters=True)``) give each step its FLOPs and bytes; a summary's
``table(counters=True, peak=...)`` reads them against a :class:`Peak`; :func:`plot` draws
them (matplotlib, the optional extra ``plot``)::

    from instrumented_convs import configure, registry
    from instrumented_convs.roofline import plot, probe

    ...                                        # train a while: the times
    timed = registry.summary(); registry.reset()
    with configure(counters=True):             # one epoch more: the FLOPs and bytes
        ...
    plot(registry.summary(), probe(), "roofline.png", times=timed)

:func:`probe` measures this machine's copy bandwidth and matmul throughput (on the CPU, or
``device="cuda"``), cached; :func:`given` puts figures the user knows in their place.
"""

from __future__ import annotations

from typing import Any, List, Optional

from ._probe import given, probe
from ._roof import Peak, as_peak, rows_of

__all__ = ["Peak", "probe", "given", "plot"]


def _leaves(rows: List[Any]) -> List[Any]:
    """The rows with no row below them (rows are in tree order)."""
    return [r for i, r in enumerate(rows) if i + 1 == len(rows) or rows[i + 1].depth <= r.depth]


def plot(summary: Any, peak: Any, path: Optional[str] = None, *, times: Any = None,
         label: Optional[str] = None, ax: Any = None, leaves: bool = True,
         names: bool = True) -> Any:  # fmt: skip
    """Each step of ``summary`` as a point on the roofline of ``peak`` (a :class:`Peak`, or a
    ``(GB/s, GFLOP/s)`` pair): its arithmetic intensity (FLOP per byte read and written) and
    its achieved GFLOP/s over its measured time (``times``: a summary of a run without the
    counters, as in ``table(counters=True, times=...)``); forward steps as circles, backward
    ones as triangles, named unless ``names=False``. ``leaves``: only the steps with no step
    below them (a parent's point is the mix of its children's). Steps that did no FLOPs (pure
    gathers and copies) have no place on the log axes: they are left out, and listed in the
    returned axes' ``ic_left_out``. Draws on ``ax`` (a matplotlib Axes: call again to put
    several runs on one plot, each with its ``label``), else on a new figure; saves it to
    ``path`` when given. Returns the Axes."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            f"plot needs matplotlib ({exc}): pip install 'instrumented_convs[plot]'"
        ) from exc
    peak = as_peak(peak)
    rows = rows_of(summary, times)
    if leaves:
        rows = _leaves(rows)
    if ax is None:
        ax = Figure(figsize=(8, 5.5)).subplots()
        ax.ic_left_out = []
    left_out = getattr(ax, "ic_left_out", [])
    shown = []
    for r in rows:
        moved = r.bytes_read + r.bytes_written
        if r.flops and moved and r.total:
            shown.append((r, r.flops / moved, r.flops / r.total / 1e9))
        else:
            left_out.append(r.name + (" [backward]" if r.phase == "backward" else ""))
    ax.ic_left_out = left_out
    colour = None
    for phase, marker in (("forward", "o"), ("backward", "^")):
        pts = [(x, y) for r, x, y in shown if r.phase == phase]
        if pts:
            kw = {"color": colour} if colour is not None else {}
            name = f"{label}, {phase}" if label else phase
            (line,) = ax.plot(*zip(*pts), marker, label=name, alpha=0.8, **kw)
            colour = line.get_color()
    if names:
        for r, x, y in shown:
            mark = " [bw]" if r.phase == "backward" else ""
            ax.annotate(r.step + mark, (x, y), fontsize=6, xytext=(3, 2),
                        textcoords="offset points")  # fmt: skip
    _draw_roof(ax, peak, [x for _, x, _ in shown])
    if path is not None:
        ax.figure.savefig(path, dpi=150, bbox_inches="tight")
    return ax


def _draw_roof(ax: Any, peak: Peak, xs: List[float]) -> None:
    """The roof of ``peak`` (bandwidth slope, then the compute ceiling) across the points,
    drawn once per axes (again, wider, when later points need it)."""
    ridge = peak.gflops / peak.gbs
    lo = min([ridge / 100] + [x / 2 for x in xs] + getattr(ax, "ic_span", [])[:1])
    hi = max([ridge * 10] + [x * 2 for x in xs] + getattr(ax, "ic_span", [])[1:])
    old = getattr(ax, "ic_roof", None)
    if old is not None:
        old.remove()
    (ax.ic_roof,) = ax.plot([lo, ridge, hi], [lo * peak.gbs, peak.gflops, peak.gflops], "-",
                            color="0.3", linewidth=1, zorder=0)  # fmt: skip
    ax.ic_span = [lo, hi]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte read and written)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"Roof: {peak.gbs:.1f} GB/s, {peak.gflops:.1f} GFLOP/s", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
