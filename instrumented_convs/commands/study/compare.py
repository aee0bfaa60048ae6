"""PyG and DGL side by side: the per-step time of each framework, aligned by role, since
the two name their steps differently (:data:`ROLES`, :func:`breakdown`); :func:`side_by_side`
and :func:`.plot.plot` read only those numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from instrumented_convs.report import Row, Summary

__all__ = [
    "ROLES",
    "LAYER",
    "MODEL_ROLES",
    "MODEL_LAYER",
    "OUTER",
    "BACKWARD_OF",
    "ORDER",
    "Breakdown",
    "backward_role",
    "breakdown",
    "side_by_side",
]

#: (role, {platform: step names under ``<layer>/``}) in display order. A role's time is the
#: inclusive time of its steps inside the layers, summed.
ROLES: Tuple[Tuple[str, Dict[str, Tuple[str, ...]]], ...] = (
    (
        "normalisation",
        {"pyg": ("gcn_norm",), "dgl": ("zero_in_degree_check", "norm_src", "norm_dst")},
    ),
    ("dense transform", {"pyg": ("lin",), "dgl": ("matmul",)}),
    ("sparse aggregation", {"pyg": ("propagate",), "dgl": ("update_all",)}),
    ("bias", {"pyg": ("bias",), "dgl": ("bias",)}),
    ("activation (in layer)", {"pyg": (), "dgl": ("activation",)}),
)
LAYER = {"pyg": "GCNConv", "dgl": "GraphConv"}
#: The same for GraphSAGE (``--model sage``): the same roles, the ``SAGEConv`` steps. The
#: biases are inside the dense steps (PyG's ``lin_l``, DGL's ``fc_self`` with mean aggregation).
SAGE_ROLES: Tuple[Tuple[str, Dict[str, Tuple[str, ...]]], ...] = (
    ("normalisation", {"pyg": (), "dgl": ()}),
    ("dense transform", {"pyg": ("lin_l", "lin_r"), "dgl": ("fc_neigh", "fc_self")}),
    ("sparse aggregation", {"pyg": ("propagate",), "dgl": ("update_all",)}),
    ("bias", {"pyg": (), "dgl": ()}),
    ("activation (in layer)", {"pyg": (), "dgl": ()}),
)
#: Each model's roles (:data:`ROLES` is the GCN's) and layer names (:data:`LAYER`); the
#: models' role names are the same, so :data:`ORDER` and :data:`BACKWARD_OF` serve them all.
MODEL_ROLES = {"gcn": ROLES, "sage": SAGE_ROLES}
MODEL_LAYER = {"gcn": LAYER, "sage": {"pyg": "SAGEConv", "dgl": "SAGEConv"}}


def backward_role(role: str) -> str:
    """The backward counterpart of a layer role: ``"bias"`` -> ``"bias (backward)"``."""
    return role.replace(" (in layer)", "") + " (backward)"


#: Each backward role and the forward role it is the backward of, in display order: the
#: layers' roles (:data:`ROLES`), the layer's own time, then autograd outside the layers.
BACKWARD_OF: Dict[str, str] = {backward_role(r): r for r in [r for r, _ in ROLES] + ["layer glue"]}
BACKWARD_OF["rest of backward"] = "rest of forward"
#: Roles after :data:`ROLES`, in display order. A run has either the backward roles
#: (:data:`BACKWARD_OF`, when it timed the backward) or the single ``backward`` region.
OUTER: Tuple[str, ...] = (
    ("layer glue", "rest of forward", "loss")
    + tuple(BACKWARD_OF)
    + ("backward", "optimizer.step", "epoch glue")
)
#: Every role, in display order.
ORDER: Tuple[str, ...] = tuple(r for r, _ in ROLES) + OUTER
#: The regions of an epoch (the study's loop); what else the epoch took is ``epoch glue``.
PHASES = ("forward", "loss", "backward", "optimizer.step")


#: The study's models, by the name ``--model`` takes.
MODELS: Dict[str, str] = {"gcn": "3-layer GCN", "sage": "3-layer GraphSAGE"}


@dataclass
class Breakdown:
    """Milliseconds per epoch for each role of one framework's run."""

    platform: str
    label: str
    epochs: int
    per_epoch_ms: Dict[str, float]
    steps: Dict[str, str]
    model: str = "gcn"

    @property
    def epoch_ms(self) -> float:
        """The mean epoch time in milliseconds (the sum of all roles)."""
        return sum(self.per_epoch_ms.values())

    @property
    def backward_split(self) -> bool:
        """Whether the backward is split by role (the run timed the layers' backward)."""
        return "rest of backward" in self.per_epoch_ms


def _layer_roles(
    summary: Summary,
    ms: Callable[[str, str], float],
    present: Callable[[str, str], bool],
    platform: str,
    phase: str,
    model: str,
) -> Tuple[Dict[str, float], Dict[str, str]]:
    """The ms per epoch and the steps of the layer's roles and glue in one phase of the epoch."""
    layer = MODEL_LAYER[model][platform]
    layer_path = f"epoch/{phase}/{layer}"
    name = backward_role if phase == "backward" else (lambda role: role)
    per: Dict[str, float] = {}
    steps: Dict[str, str] = {}
    roles = MODEL_ROLES[model]
    for role, names in roles:
        mine = names[platform]
        if phase == "backward":  # only the steps whose forward did something differentiable
            mine = tuple(s for s in mine if present(f"{layer_path}/{s}", phase))
        per[name(role)] = sum(ms(f"{layer_path}/{s}", phase) for s in mine)
        steps[name(role)] = " + ".join(mine) if mine else "-"
    per[name("layer glue")] = ms(layer_path, phase) - sum(per.values())
    # steps of the layer in no role (DGL SAGEConv's feat_drop) are glue too: say which
    assigned = {s for _, names in roles for s in names[platform]}
    others = sorted({r.step for r in summary.children(layer_path) if r.phase == phase} - assigned)
    steps[name("layer glue")] = " + ".join(
        [f"{layer}{' [backward]' if phase == 'backward' else ''} self time"] + others
    )
    return per, steps


def breakdown(
    summary: Summary, platform: str, label: Optional[str] = None, model: str = "gcn"
) -> Breakdown:
    """Per-epoch milliseconds by role from a study summary (``epoch/forward/<layer>/...``).

    ``model`` is the study's model (``"gcn"`` or ``"sage"``): it picks the layer and the role
    table (:data:`MODEL_ROLES`, :data:`MODEL_LAYER`).

    The two frameworks name their steps differently (``gcn_norm`` vs ``norm_src``/``norm_dst``,
    ``lin`` vs ``matmul``, ``propagate`` vs ``update_all``). :data:`ROLES` maps each framework's
    steps to a common role (:data:`MODEL_ROLES` does the same for each model: the GCN's table,
    and GraphSAGE's, whose ``SAGEConv`` has no normalisation or bias step of its own), and
    :func:`breakdown` turns a run's summary into milliseconds per epoch for each role; the rows
    add up to the epoch time. The backward is split the same way when the run timed it (the
    layers' ``[backward]`` rows under ``epoch/backward``): each role has a backward counterpart
    (:func:`backward_role`), and autograd's work outside the layers is ``rest of backward``;
    without backward rows the backward is one role, ``backward``. :func:`side_by_side` (text)
    and :func:`.plot.plot` (a chart) read only those numbers.

    With backward rows under ``epoch/backward/<layer>`` (backward timing on, the default),
    the backward is split by role too (:data:`BACKWARD_OF`); without them it is one role,
    ``backward``. Either way the roles add up to the mean epoch time.
    """
    epoch = summary["epoch"]
    n = epoch.count
    if model not in MODEL_ROLES:
        raise ValueError(f"model must be one of {sorted(MODEL_ROLES)}, not {model!r}")
    layer = MODEL_LAYER[model][platform]

    def rows(path: str, phase: str) -> List[Row]:
        return [r for r in summary.rows if r.name == path and r.phase == phase]

    def ms(path: str, phase: str = "forward") -> float:
        # summed over rows: one per layer instance in a summary grouped by layer
        return sum(r.total for r in rows(path, phase)) * 1e3 / n

    def present(path: str, phase: str) -> bool:
        return bool(rows(path, phase))

    per, steps = _layer_roles(summary, ms, present, platform, "forward", model)
    per["rest of forward"] = ms("epoch/forward") - ms(f"epoch/forward/{layer}")
    steps["rest of forward"] = "ReLU, log_softmax"
    per["loss"] = ms("epoch/loss")
    steps["loss"] = "region"
    bw_layer = f"epoch/backward/{layer}"
    if present(bw_layer, "backward"):
        bw_per, bw_steps = _layer_roles(summary, ms, present, platform, "backward", model)
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
    return Breakdown(platform, label or platform, n, per, steps, model)


def side_by_side(runs: Sequence[Breakdown], title: Optional[str] = None) -> str:
    """A text table: one row per role, per framework its ms/epoch, share, and its steps.

    ``title`` defaults to ``PyG vs DGL, time per epoch by role``, with the model's name
    (``3-layer GraphSAGE``) when the runs are not the GCN.

    Roles no run has time for are left out; a backward role that a run lacks (its backward
    was not split, or the step did nothing differentiable) reads 0.
    """
    if title is None:
        models = sorted({b.model for b in runs} - {"gcn"})
        title = (
            "PyG vs DGL, "
            + "".join(f"{MODELS.get(m, m)}, " for m in models)
            + "time per epoch by role"
        )
    roles = [r for r in ORDER if any(b.per_epoch_ms.get(r, 0.0) for b in runs)]
    role_w = max(len(r) for r in roles + ["role"])
    step_w = {
        b.label: max([len("steps")] + [len(b.steps.get(r, "-")) for r in roles]) for b in runs
    }
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
        total += (
            " | "
            + (
                f"{b.epoch_ms:10.2f} {100.0:5.1f}%  "
                f"{('mean of ' + str(b.epochs) + ' epochs').ljust(step_w[b.label])}"
            )[:block_w]
        )
    lines.append(total)
    return "\n".join(lines)
