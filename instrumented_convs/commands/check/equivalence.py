"""Section 1: our layers against the stock ones on this device (outputs, gradients,
``state_dict``), for the detailed layers over their input kinds and a sample of generic
layers (:mod:`._cases`): a drop-in must change nothing the model computes.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, List, Optional, Tuple

import torch

from ... import registry
from ._cases import Case, cases
from ._report import FAIL, PASS, SKIPPED, Section

__all__ = ["run_case", "section", "RERUNS", "SPREAD"]

RERUNS = 3  #: how often the stock layer runs again where ours is not bit for bit equal
SPREAD = 2.0  #: ours passes within this many times the stock layer's own largest difference
#: ... or within this many units in the last place of the tensor's largest value (a sum in
#: another order is off by a few of them), where stock differs from itself at all
ULPS = 8

ABOUT = (
    "Ours against the stock layer on this device: outputs, the gradients of the inputs and "
    "of every parameter, and state_dict, bit for bit (or, where the stock layer differs from "
    "itself run to run, within twice its largest difference in 3 more runs, or 8 units in "
    "the last place of the tensor's largest value); and our rows "
    "recorded, with CUDA events on CUDA."
)


def _tensors(out: Any) -> List[torch.Tensor]:
    """The tensors of a layer's output (nested tuples, lists and dicts, dicts in key order)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):  # a heterogeneous layer's: per node type
        return [t for k in sorted(out, key=str) for t in _tensors(out[k])]
    return []


def _leaves(obj: Any, found: List[torch.Tensor]) -> Any:
    """``obj`` with its float tensors made leaves that require grad (listed in ``found``)."""
    if isinstance(obj, torch.Tensor) and obj.is_floating_point() and not obj.is_sparse:
        if obj.layout != torch.strided:
            return obj
        leaf = obj.detach().requires_grad_()
        found.append(leaf)
        return leaf
    if isinstance(obj, tuple):
        return tuple(_leaves(o, found) for o in obj)
    if isinstance(obj, dict):
        return {k: _leaves(v, found) for k, v in obj.items()}
    return obj


def _run(module: torch.nn.Module, case: Case, nodes: int, device: torch.device) -> Dict[str, Any]:
    """Forward and backward of ``module``: every output and gradient, detached."""
    args, kwargs = case.inputs(nodes, device)
    leaves: List[torch.Tensor] = []
    args, kwargs = _leaves(args, leaves), _leaves(kwargs, leaves)
    torch.manual_seed(0)
    outs = _tensors(module(*args, **kwargs))
    got: Dict[str, Any] = {f"out.{i}": o.detach().clone() for i, o in enumerate(outs)}
    g = torch.Generator().manual_seed(5)
    terms = [
        (o.float() * torch.rand(o.shape, generator=g).to(o.device)).sum()
        for o in outs
        if o.is_floating_point() and o.requires_grad
    ]
    if terms:
        torch.stack(terms).sum().backward()
    for i, leaf in enumerate(leaves):
        if leaf.grad is not None:
            got[f"grad.input.{i}"] = leaf.grad.clone()
    for name, p in module.named_parameters():
        if p.grad is not None:
            got[f"grad.{name}"] = p.grad.clone()
            p.grad = None
    return got


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit for bit (a NaN equal to a NaN in the same place)."""
    if x.is_floating_point() or x.is_complex():
        return bool(torch.allclose(x, y, rtol=0, atol=0, equal_nan=True))
    return torch.equal(x, y)


def _diffs(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, float]:
    """Each result's largest difference: 0 bit for bit, inf where the shapes, dtypes or NaNs
    differ or one side lacks the result."""
    out = {k: float("inf") for k in set(a) ^ set(b)}
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if x.shape != y.shape or x.dtype != y.dtype:
            out[k] = float("inf")
        elif _same(x, y):
            out[k] = 0.0
        else:
            d = (x.double() - y.double()).abs().nan_to_num(nan=float("inf")).max().item()
            out[k] = d if x.numel() else 0.0
    return out


def _diff(a: Dict[str, Any], b: Dict[str, Any]) -> Tuple[bool, float, str]:
    """(bit for bit equal, the largest difference, where)."""
    if set(a) != set(b):
        return False, float("inf"), f"different results: {sorted(set(a) ^ set(b))}"
    for k in sorted(a):
        x, y = a[k], b[k]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf"), f"{k}: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)}"
    d = _diffs(a, b)
    where = max(sorted(d), key=lambda k: d[k], default="")
    return all(v == 0.0 for v in d.values()), (d[where] if where else 0.0), where


def _ulp(t: torch.Tensor) -> float:
    """One unit in the last place of ``t``'s largest magnitude (0 for a non-float tensor)."""
    if not t.is_floating_point() or t.numel() == 0:
        return 0.0
    top = t.detach().abs().max().double().item()
    return float(torch.finfo(t.dtype).eps) * top if top == top else 0.0


def run_case(
    case: Case, device: torch.device, nodes: int, place: Optional[torch.device] = None
) -> Tuple[str, str, Dict[str, Any]]:
    """Compare ours with the stock layer for ``case`` on ``device``: (status, detail,
    figures). ``place``: where the layers and tensors live, ``device`` by default (the CPU
    in tests, where fake events stand in for CUDA's)."""
    cuda = device.type == "cuda"
    device = place or device
    try:
        if case.needs:
            importlib.import_module(case.needs)
        stock, ours = case.make(True), case.make(False)
    except ImportError as exc:
        return SKIPPED, f"needs {exc.name or exc}: not installed", {}
    sd_s, sd_o = stock.state_dict(), ours.state_dict()
    if list(sd_s) != list(sd_o) or not all(torch.equal(sd_s[k], sd_o[k]) for k in sd_s):
        return FAIL, "state_dict differs from the stock layer's", {"keys": list(sd_o)}
    try:
        stock, ours = stock.to(device), ours.to(device)
        case.inputs(nodes, device)
    except Exception as exc:  # e.g. a DGL build without CUDA
        return SKIPPED, f"cannot run on {device}: {type(exc).__name__}: {exc}", {}
    expected = _run(stock, case, nodes, device)
    registry.reset()
    got = _run(ours, case, nodes, device)
    pending = len(registry.pending)
    rows = [r for r in registry.summary().rows if r.name == case.cls and r.phase == "forward"]
    equal, worst, where = _diff(expected, got)
    data = {"max_abs_diff": worst, "where": where, "rows": len(registry.summary().rows)}
    if not rows or rows[0].count < 1:
        return FAIL, "the same results, but no row recorded for the layer", data
    if not any(k.startswith("out.") for k in got):
        return FAIL, "the layer gave no tensor to compare", data
    if cuda and pending == 0:
        return FAIL, "recorded, but not with CUDA events", data
    if equal:
        return PASS, f"bit for bit ({len(got)} tensors: outputs, gradients)", data
    # The stock layer run again: where it differs from itself (atomic scatter-adds on a GPU
    # sum in another order each run), ours may differ from it as much: per result, within
    # SPREAD times the largest difference of RERUNS stock runs from the first, or ULPS units
    # in the last place of its largest value.
    ours_d = _diffs(expected, got)
    spreads = {k: 0.0 for k in ours_d}
    for _ in range(RERUNS):
        for k, v in _diffs(expected, _run(stock, case, nodes, device)).items():
            spreads[k] = max(spreads.get(k, 0.0), v)
    spread = max(spreads.values(), default=0.0)
    data["stock_spread"] = spread
    allowed = {
        k: max(SPREAD * spreads[k], ULPS * _ulp(expected[k]) if k in expected else 0)
        for k in ours_d
    }
    off = [k for k in sorted(ours_d) if ours_d[k] > allowed[k]]
    if spread == 0 or off:
        k = off[0] if off else where
        data["allowed"] = allowed.get(k, 0.0)
        return FAIL, f"differs from the stock layer by {ours_d.get(k, worst):.3g} at {k}", data
    units = ULPS * _ulp(expected[where])
    text = f"within the stock layer's own run-to-run difference ({worst:.3g} at {where}; stock's"
    text += f" {spreads.get(where, 0.0):.3g} there in {RERUNS} runs, {ULPS} units in the last"
    return PASS, f"{text} place {units:.3g})", data


def section(device: torch.device, quick: bool, progress: Any = None) -> Section:
    """The equivalence section: one line per case (gradients of the inputs and of every
    parameter).

    Equal means bit for bit. Where the stock layer itself differs from one run to the next on
    this device (atomic scatters on a GPU), ours passes when each tensor is within
    :data:`SPREAD` times the stock layer's own run-to-run difference of that tensor (the largest
    of :data:`RERUNS` runs), or within :data:`ULPS` units in the last place of the tensor's
    largest value, whichever is larger, and the line says so. (Three reruns can all land closer
    than the next one: docs/check.md.) Ours must also have recorded its rows, with CUDA events
    on a CUDA device.
    """
    s = Section("1. Equivalence on this device", ABOUT)
    nodes = 40 if quick else 300
    for case in cases(quick):
        if progress is not None:
            progress(f"equivalence: {case.name}")
        try:
            status, detail, data = run_case(case, device, nodes)
        except Exception as exc:  # a line fails, the check goes on
            status, detail, data = FAIL, f"raised {type(exc).__name__}: {exc}", {}
        s.add(case.name, status, detail, **data)
    registry.reset()
    return s
