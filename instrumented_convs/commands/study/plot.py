"""A stacked bar chart of a :class:`~instrumented_convs.commands.study.compare.Breakdown`
(matplotlib)."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from .compare import BACKWARD_OF, ORDER, Breakdown
from .data import MissingDependency

__all__ = ["plot"]


def _lighter(rgba: Tuple[float, ...], amount: float = 0.55) -> Tuple[float, ...]:
    """``rgba`` mixed with white (``amount`` of white), same alpha."""
    r, g, b = (c + (1.0 - c) * amount for c in rgba[:3])
    return (r, g, b, rgba[3] if len(rgba) > 3 else 1.0)


def plot(runs: Sequence[Breakdown], path: str) -> None:
    """A stacked bar chart (ms per epoch by role, one bar per framework) written to ``path``.

    Each forward role has a colour of its own; its backward counterpart (``... (backward)``)
    is stacked in the backward part of the bar in a lighter shade of that colour, hatched.
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependency(
            f"--plot needs matplotlib, which is not installed here ({exc}); "
            "pip install matplotlib (or instrumented_convs[study])"
        ) from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roles: List[str] = [r for r in ORDER if any(b.per_epoch_ms.get(r, 0.0) > 0 for b in runs)]
    # A colour per role that is not a backward counterpart (the counterparts share theirs), for
    # those the chart shows, in display order: tab10's ten, then tab20b's darkest.
    palette = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20b").colors)[::4]
    shown = set(roles) | {BACKWARD_OF[r] for r in roles if r in BACKWARD_OF}
    colours: Dict[str, Any] = {}
    for role in ORDER:
        if role in shown and role not in BACKWARD_OF:
            colours[role] = palette[len(colours) % len(palette)]
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    bottoms = [0.0] * len(runs)
    labels = [b.label for b in runs]
    for role in roles:
        values = [max(b.per_epoch_ms.get(role, 0.0), 0.0) for b in runs]
        if role in BACKWARD_OF:
            style = dict(color=_lighter(colours[BACKWARD_OF[role]]), hatch="//", edgecolor="white")
        else:
            style = dict(color=colours[role])
        ax.bar(labels, values, bottom=bottoms, label=role, linewidth=0, **style)
        bottoms = [a + v for a, v in zip(bottoms, values)]
    ax.set_ylabel("milliseconds per epoch")
    ax.set_title("Where an epoch goes: 3-layer GCN (hatched: backward)")
    handles, names = ax.get_legend_handles_labels()
    # top of the stack first, so the legend reads in the order of the bars
    ax.legend(
        handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
