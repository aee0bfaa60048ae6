"""PyG and DGL side by side: the per-step time of each framework, aligned by role.

The two frameworks name their steps differently (``gcn_norm`` vs ``norm_src``/``norm_dst``,
``lin`` vs ``matmul``, ``propagate`` vs ``update_all``). :data:`ROLES` maps each framework's
steps to a common role, and :func:`breakdown` turns a run's summary into milliseconds per
epoch for each role; the rows add up to the epoch time. The backward is split the same way
when the run timed it (the layers' ``[backward]`` rows under ``epoch/backward``): each role
has a backward counterpart (:func:`backward_role`), and autograd's work outside the layers is
``rest of backward``; without backward rows the backward is one role, ``backward``.
:func:`side_by_side` (text) and :func:`instrumented_convs.study.plot.plot` (a chart) read only
those numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from instrumented_convs import Row, Summary

__all__ = ["ROLES", "LAYER", "OUTER", "BACKWARD_OF", "ORDER", "Breakdown", "backward_role", "breakdown",
           "side_by_side"]

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


def backward_role(role: str) -> str:
    """The backward counterpart of a layer role: ``"bias"`` -> ``"bias (backward)"``."""
    return role.replace(" (in layer)", "") + " (backward)"


#: Each backward role and the forward role it is the backward of, in display order: the
#: layers' roles (:data:`ROLES`), the layer's own time, then autograd outside the layers.
BACKWARD_OF: Dict[str, str] = {backward_role(r): r for r in [r for r, _ in ROLES] + ["layer glue"]}
BACKWARD_OF["rest of backward"] = "rest of forward"
#: Roles after :data:`ROLES`, in display order. A run has either the backward roles
#: (:data:`BACKWARD_OF`, when it timed the backward) or the single ``backward`` region.
OUTER: Tuple[str, ...] = (("layer glue", "rest of forward", "loss") + tuple(BACKWARD_OF)
                          + ("backward", "optimizer.step", "epoch glue"))
#: Every role, in display order.
ORDER: Tuple[str, ...] = tuple(r for r, _ in ROLES) + OUTER
#: The regions of an epoch (the study's loop); what else the epoch took is ``epoch glue``.
PHASES = ("forward", "loss", "backward", "optimizer.step")


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

    @property
    def backward_split(self) -> bool:
        """Whether the backward is split by role (the run timed the layers' backward)."""
        return "rest of backward" in self.per_epoch_ms


def _layer_roles(ms: Callable[[str, str], float], present: Callable[[str, str], bool], platform: str,
                 phase: str) -> Tuple[Dict[str, float], Dict[str, str]]:
    """The ms per epoch and the steps of the layer's roles and glue in one phase of the epoch."""
    layer = LAYER[platform]
    layer_path = f"epoch/{phase}/{layer}"
    name = backward_role if phase == "backward" else (lambda role: role)
    per: Dict[str, float] = {}
    steps: Dict[str, str] = {}
    for role, names in ROLES:
        mine = names[platform]
        if phase == "backward":  # only the steps whose forward did something differentiable
            mine = tuple(s for s in mine if present(f"{layer_path}/{s}", phase))
        per[name(role)] = sum(ms(f"{layer_path}/{s}", phase) for s in mine)
        steps[name(role)] = " + ".join(mine) if mine else "-"
    per[name("layer glue")] = ms(layer_path, phase) - sum(per.values())
    steps[name("layer glue")] = f"{layer}{' [backward]' if phase == 'backward' else ''} self time"
    return per, steps


def breakdown(summary: Summary, platform: str, label: Optional[str] = None) -> Breakdown:
    """Per-epoch milliseconds by role from a study summary (``epoch/forward/<layer>/...``).

    With backward rows under ``epoch/backward/<layer>`` (backward timing on, the default),
    the backward is split by role too (:data:`BACKWARD_OF`); without them it is one role,
    ``backward``. Either way the roles add up to the mean epoch time.
    """
    epoch = summary["epoch"]
    n = epoch.count
    layer = LAYER[platform]

    def rows(path: str, phase: str) -> List[Row]:
        return [r for r in summary.rows if r.name == path and r.phase == phase]

    def ms(path: str, phase: str = "forward") -> float:
        # summed over rows: one per layer instance in a summary grouped by layer
        return sum(r.total for r in rows(path, phase)) * 1e3 / n

    def present(path: str, phase: str) -> bool:
        return bool(rows(path, phase))

    per, steps = _layer_roles(ms, present, platform, "forward")
    per["rest of forward"] = ms("epoch/forward") - ms(f"epoch/forward/{layer}")
    steps["rest of forward"] = "ReLU, log_softmax"
    per["loss"] = ms("epoch/loss")
    steps["loss"] = "region"
    bw_layer = f"epoch/backward/{layer}"
    if present(bw_layer, "backward"):
        bw_per, bw_steps = _layer_roles(ms, present, platform, "backward")
        per.update(bw_per)
        steps.update(bw_steps)
        per["rest of backward"] = ms("epoch/backward") - ms(bw_layer, "backward")
        steps["rest of backward"] = "ReLU, log_softmax, loss, AccumulateGrad"
    else:
        per["backward"] = ms("epoch/backward")
        steps["backward"] = "region"
    per["optimizer.step"] = ms("epoch/optimizer.step")
    steps["optimizer.step"] = "region"
    per["epoch glue"] = ms("epoch") - sum(ms(f"epoch/{p}") for p in PHASES)
    steps["epoch glue"] = "zero_grad"
    return Breakdown(platform, label or platform, n, per, steps)


def side_by_side(runs: Sequence[Breakdown], title: str = "PyG vs DGL, time per epoch by role") -> str:
    """A text table: one row per role, per framework its ms/epoch, share, and its steps.

    Roles no run has time for are left out; a backward role that a run lacks (its backward
    was not split, or the step did nothing differentiable) reads 0.
    """
    roles = [r for r in ORDER if any(b.per_epoch_ms.get(r, 0.0) for b in runs)]
    role_w = max(len(r) for r in roles + ["role"])
    step_w = {b.label: max([len("steps")] + [len(b.steps.get(r, "-")) for r in roles]) for b in runs}
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
            line += f" | {v:10.2f} {share:5.1f}%  {b.steps.get(role, '-').ljust(step_w[b.label])}"
        lines.append(line)
    lines.append("-" * width)
    total = "  " + "epoch".ljust(role_w)
    for b in runs:
        block_w = 10 + 1 + 6 + 2 + step_w[b.label]
        total += " | " + f"{b.epoch_ms:10.2f} {100.0:5.1f}%  {('mean of ' + str(b.epochs) + ' epochs').ljust(step_w[b.label])}"[:block_w]
    lines.append(total)
    return "\n".join(lines)
