"""PyG and DGL side by side: the per-step time of each framework, aligned by role.

The two frameworks name their steps differently (``gcn_norm`` vs ``norm_src``/``norm_dst``,
``lin`` vs ``matmul``, ``propagate`` vs ``update_all``). :data:`ROLES` maps each framework's
steps to a common role, and :func:`breakdown` turns a run's summary into milliseconds per
epoch for each role; the rows add up to the epoch time. :func:`side_by_side` (text) and
:func:`instrumented_convs.study.plot.plot` (a chart) read only those numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from instrumented_convs import Summary

__all__ = ["ROLES", "LAYER", "OUTER", "Breakdown", "breakdown", "side_by_side"]

#: (role, {platform: step names under ``<layer>/``}) in display order. A role's time is the
#: inclusive time of its steps inside the layers, summed.
ROLES: Tuple[Tuple[str, Dict[str, Tuple[str, ...]]], ...] = (
    ("normalisation", {"pyg": ("gcn_norm",), "dgl": ("zero_in_degree_check", "norm_src", "norm_dst")}),
    ("dense transform", {"pyg": ("lin",), "dgl": ("matmul",)}),
    ("sparse aggregation", {"pyg": ("propagate",), "dgl": ("update_all",)}),
    ("bias", {"pyg": ("bias",), "dgl": ("bias",)}),
    ("activation (in layer)", {"pyg": (), "dgl": ("activation",)}),
)
LAYER = {"pyg": "GCNConv", "dgl": "GraphConv"}
#: Roles outside the layers, read from the epoch regions.
OUTER = ("layer glue", "rest of forward", "loss", "backward", "optimizer.step", "epoch glue")


@dataclass
class Breakdown:
    """Milliseconds per epoch for each role of one framework's run."""

    platform: str
    label: str
    epochs: int
    per_epoch_ms: Dict[str, float]
    steps: Dict[str, str]

    @property
    def epoch_ms(self) -> float:
        """The mean epoch time in milliseconds (the sum of all roles)."""
        return sum(self.per_epoch_ms.values())


def breakdown(summary: Summary, platform: str, label: Optional[str] = None) -> Breakdown:
    """Per-epoch milliseconds by role from a study summary (``epoch/forward/<layer>/...``)."""
    epoch = summary["epoch"]
    n = epoch.count
    layer_path = f"epoch/forward/{LAYER[platform]}"

    def ms(path: str) -> float:
        return summary[path].total * 1e3 / n if path in summary else 0.0

    per: Dict[str, float] = {}
    steps: Dict[str, str] = {}
    in_roles = 0.0
    for role, names in ROLES:
        mine = names[platform]
        per[role] = sum(ms(f"{layer_path}/{s}") for s in mine)
        steps[role] = " + ".join(mine) if mine else "-"
        in_roles += per[role]
    per["layer glue"] = ms(layer_path) - in_roles
    steps["layer glue"] = f"{LAYER[platform]} self time"
    per["rest of forward"] = ms("epoch/forward") - ms(layer_path)
    steps["rest of forward"] = "ReLU, log_softmax"
    for phase in ("loss", "backward", "optimizer.step"):
        per[phase] = ms(f"epoch/{phase}")
        steps[phase] = "region"
    per["epoch glue"] = ms("epoch") - sum(ms(f"epoch/{p}") for p in ("forward", "loss", "backward", "optimizer.step"))
    steps["epoch glue"] = "zero_grad"
    return Breakdown(platform, label or platform, n, per, steps)


def side_by_side(runs: Sequence[Breakdown], title: str = "PyG vs DGL, time per epoch by role") -> str:
    """A text table: one row per role, per framework its ms/epoch, share, and its steps."""
    roles = [r for r, _ in ROLES] + list(OUTER)
    roles = [r for r in roles if any(b.per_epoch_ms.get(r, 0.0) for b in runs)]
    role_w = max(len(r) for r in roles + ["role"])
    step_w = {b.label: max([len("steps")] + [len(b.steps[r]) for r in roles]) for b in runs}
    head1 = "  " + "".ljust(role_w)
    head2 = "  " + "role".ljust(role_w)
    for b in runs:
        block = f"{'ms/epoch':>10} {'share':>6}  {'steps'.ljust(step_w[b.label])}"
        head1 += " | " + b.label.center(len(block))
        head2 += " | " + block
    width = len(head2)
    lines = [f"--- {title} " + "-" * max(3, width - len(title) - 5), head1, head2, "-" * width]
    for role in roles:
        line = "  " + role.ljust(role_w)
        for b in runs:
            v = b.per_epoch_ms.get(role, 0.0)
            share = 100.0 * v / b.epoch_ms if b.epoch_ms else 0.0
            line += f" | {v:10.2f} {share:5.1f}%  {b.steps[role].ljust(step_w[b.label])}"
        lines.append(line)
    lines.append("-" * width)
    total = "  " + "epoch".ljust(role_w)
    for b in runs:
        block_w = 10 + 1 + 6 + 2 + step_w[b.label]
        total += " | " + f"{b.epoch_ms:10.2f} {100.0:5.1f}%  {('mean of ' + str(b.epochs) + ' epochs').ljust(step_w[b.label])}"[:block_w]
    lines.append(total)
    return "\n".join(lines)
