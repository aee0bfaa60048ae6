"""A stacked bar chart of a :class:`~instrumented_convs.study.compare.Breakdown` (matplotlib)."""
from __future__ import annotations

from typing import List, Sequence

from .compare import OUTER, ROLES, Breakdown
from .data import MissingDependency

__all__ = ["plot"]


def plot(runs: Sequence[Breakdown], path: str) -> None:
    """A stacked bar chart (ms per epoch by role, one bar per framework) written to ``path``."""
    try:
        import matplotlib
    except ImportError as exc:
        raise MissingDependency(f"--plot needs matplotlib, which is not installed here ({exc}); "
                                "pip install matplotlib (or instrumented_convs[study])") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roles: List[str] = [r for r, _ in ROLES] + list(OUTER)
    roles = [r for r in roles if any(b.per_epoch_ms.get(r, 0.0) > 0 for b in runs)]
    fig, ax = plt.subplots(figsize=(7, 5))
    bottoms = [0.0] * len(runs)
    labels = [b.label for b in runs]
    cmap = plt.get_cmap("tab10")
    for i, role in enumerate(roles):
        values = [max(b.per_epoch_ms.get(role, 0.0), 0.0) for b in runs]
        ax.bar(labels, values, bottom=bottoms, label=role, color=cmap(i % 10))
        bottoms = [a + v for a, v in zip(bottoms, values)]
    ax.set_ylabel("milliseconds per epoch")
    ax.set_title("Where an epoch goes: 3-layer GCN")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
