"""The advice, part 2: a change timed on the user's own layer before it is advised.

At the end of an advised run, each candidate change of a noted layer still alive is timed on
that layer's last call's inputs (held by :mod:`..core.meters.signals`): forward and backward
of a deep copy run stock, of a deep copy given the change, and of the stock copy again (the
A/A), interleaved, warm, with nothing recorded; outputs and gradients compared. The user's
model, its gradients and every random state are left as they were. A candidate is one entry
of :data:`CANDIDATES` (:func:`register`), the framework's package says which.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import logging
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from ..core.configure import configure
from ..core.meters import signals

__all__ = [
    "Change",
    "CANDIDATES",
    "register",
    "untouched",
    "forward_backward",
    "time_change",
    "measure",
    "keep_layers",
    "MIN_ROUNDS",
    "Unfit",
]

logger = logging.getLogger(__name__)

#: Relative difference under which a change's outputs and gradients are "equal" (float32
#: sums in another order: a sparse product against a scatter, say).
RTOL = 1e-4


@dataclass
class Change:
    """A candidate change of one layer: its ``rule``, what to write (``change``), the
    changed call's ``(args, kwargs)`` (``inputs``), the ``layer`` to run them on where the
    change is the layer's own (else a copy of the user's), and what converting the input
    costs once (``convert_s``: paid once where the graph never changes, else at every call)."""

    rule: str
    change: str
    inputs: Tuple[tuple, dict]
    layer: Any = None
    convert_s: float = 0.0
    #: the largest difference of outputs and gradients, relative to the largest value, under
    #: which the change is the same model (more for lower precision: said in the advice)
    tolerance: float = RTOL
    #: whether ``convert_s`` is paid once whatever the graph (a compilation), not per graph
    convert_once: bool = False
    #: which of a rule's candidates this is, in a few words (where a rule has several)
    variant: str = ""
    #: where the user's calls were each given a graph made anew: the stock calls' inputs
    #: made anew before each (outside its time), as the user's were
    remake: Optional[Callable[[], Tuple[tuple, dict]]] = None


#: The fewest rounds a change is timed in: fewer give no median and no A/A to speak of.
MIN_ROUNDS = 3


def _said(x: float) -> str:
    """``0.67 s``, ``9 s``, ``123 s``: a budget in words (whole seconds from ten on)."""
    return f"{x:.0f} s" if x >= 10 else f"{x:.2g} s"


class Unfit(Exception):
    """A change whose :data:`MIN_ROUNDS` rounds, judged by its warm-up calls, would not fit
    the seconds it was given (``need``: the seconds they would take)."""

    def __init__(self, need: float) -> None:
        super().__init__(f"{MIN_ROUNDS} rounds need about {_said(need)}")
        self.need = need


#: ``candidate(layer, facts)`` -> a :class:`Change` or None; by framework and rule.
Candidate = Callable[[Any, Dict[str, Any]], Optional[Change]]
CANDIDATES: List[Tuple[str, str, Candidate]] = []


def register(framework: str, rule: str, candidate: Candidate) -> None:
    """Time ``candidate``'s changes (of ``rule``) on the noted layers of ``framework``
    (``pyg``, ``dgl``)."""
    if (framework, rule, candidate) not in CANDIDATES:
        CANDIDATES.append((framework, rule, candidate))


@contextlib.contextmanager
def untouched() -> Iterator[None]:
    """Nothing recorded (``configure(enabled=False)``), no warning shown, and the random states
    of Python, NumPy (where imported) and torch (CPU and every CUDA device) as they were after."""
    py = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:  # (torch's notes on a change, beta sparse layouts say: the user's run is not theirs)
        with configure(enabled=False), torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        random.setstate(py)
        if np_state is not None:
            np.random.set_state(np_state)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _leaf(value: Any) -> Any:
    """An input as a trial's: a tensor that requires a gradient a new leaf that requires one
    (its autograd graph is the user's), so that backward reaches it as it did; any other as
    it is (detaching would drop a subclass's own state: PyG's ``EdgeIndex``)."""
    if isinstance(value, torch.Tensor):
        if not value.requires_grad:
            return value
        t = value.detach()
        return t.requires_grad_() if t.is_floating_point() else t
    if isinstance(value, tuple):
        return tuple(_leaf(v) for v in value)
    return value


def _tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def forward_backward(layer: Any, inputs: Tuple[tuple, dict]) -> Tuple[List[torch.Tensor], float]:
    """One forward and backward of ``layer`` on fresh leaves of ``inputs``: its outputs and
    gradients (the layer's parameters', then the inputs'), and its seconds."""
    args, kwargs = _leaf(inputs[0]), {k: _leaf(v) for k, v in inputs[1].items()}
    for p in layer.parameters():
        p.grad = None
    sync = torch.cuda.synchronize if any(t.is_cuda for t in _tensors(args)) else None
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    out = _tensors(layer(*args, **kwargs))
    loss = sum(o.float().sum() for o in out if o.is_floating_point() and o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    if sync is not None:
        sync()
    seconds = time.perf_counter() - t0
    leaves = [t for t in _tensors((args, *kwargs.values())) if t.requires_grad]
    grads = [p.grad for p in layer.parameters()] + [t.grad for t in leaves]
    return [o.detach() for o in out] + [g for g in grads if g is not None], seconds


def _call(layer: Any, inputs: Any) -> Tuple[List[torch.Tensor], float]:
    """:func:`forward_backward` on ``inputs``, or on those ``inputs()`` makes (made before
    the call, outside its time)."""
    return forward_backward(layer, inputs() if callable(inputs) else inputs)


def _difference(a: List[torch.Tensor], b: List[torch.Tensor]) -> Optional[float]:
    """The largest difference of two results relative to the largest value, or None where
    their shapes differ (not the same computation)."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return None
    worst = 0.0
    for x, y in zip(a, b):
        if x.numel():
            scale = max(float(x.abs().max()), 1e-12)
            worst = max(worst, float((x.float() - y.float()).abs().max()) / scale)
    return worst


def time_change(
    layer: Any, stock_inputs: Tuple[tuple, dict], change: Change, seconds: float
) -> Dict[str, Any]:
    """Time ``change`` against ``layer`` (copies of it, nothing of the user's touched) for at
    most ``seconds``: rounds of stock, changed and stock again, the order reversed every
    other round, after a warm-up call of each (:class:`Unfit` where :data:`MIN_ROUNDS`
    rounds would not fit). The medians a call, the A/A's, the rounds, and
    how the outputs compare."""
    stock, again = copy.deepcopy(layer), copy.deepcopy(layer)
    changed = change.layer if change.layer is not None else copy.deepcopy(layer)
    given: Any = change.remake or stock_inputs
    runs = {"stock": (stock, given), "changed": (changed, change.inputs)}
    runs["stock again"] = (again, given)
    ref, first = _call(stock, given)  # warm, and the results compared
    got, second = _call(changed, change.inputs)
    third = _call(again, given)[1]
    # the rounds are never cut short: where the warm-up calls say they would overrun, none
    need = MIN_ROUNDS * (first + second + third)
    if need > seconds:
        raise Unfit(need)
    times: Dict[str, List[float]] = {k: [] for k in runs}
    end = time.perf_counter() + seconds
    rounds = 0
    while rounds < MIN_ROUNDS or (time.perf_counter() < end and rounds < 50):
        order = list(runs) if rounds % 2 == 0 else list(reversed(runs))
        for name in order:
            times[name].append(_call(*runs[name])[1])
        rounds += 1
    diff = _difference(ref, got)
    med = {k: statistics.median(v) for k, v in times.items()}
    aa = [abs(a - b) for a, b in zip(times["stock"], times["stock again"])]
    rounds_ = list(zip(times["stock"], times["changed"], times["stock again"]))
    faster = sum(c < min(a, b) for a, c, b in rounds_)
    return {
        "change": change.change,
        "variant": change.variant,
        "stock_s": med["stock"],
        "changed_s": med["changed"],
        "aa_s": statistics.median(aa),
        "convert_s": change.convert_s,
        "convert_once": change.convert_once,
        "rounds": rounds,
        "faster_rounds": faster,
        # a round's saving against the faster of its two stock calls: a busy moment spoils
        # one round, not the median of them
        "paired_saving_s": statistics.median(min(a, b) - c for a, c, b in rounds_),
        "difference": diff,
        "tolerance": change.tolerance,
        "equal": diff is not None and diff <= change.tolerance,
    }


def keep_layers() -> None:
    """Hold the layers noted from now on, not only their inputs (``run --advise``: the changes
    are timed after the script's end, when a model made in a function is gone)."""
    signals.keep_layers(True)


def _better(new: Dict[str, Any], old: Dict[str, Any]) -> bool:
    """Whether a rule's candidate timed on a layer beats another timed there: equal outputs
    first, then the larger saving round by round."""
    if new["equal"] != old["equal"]:
        return bool(new["equal"])
    return bool(new["paired_saving_s"] > old["paired_saving_s"])


def _kept(new: Dict[str, Any], old: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Of two candidates of a rule timed on one layer, the better, the other named in its
    ``also_timed`` (its variant, seconds a call and whether equal)."""
    if old is None:
        return new
    best, other = (new, old) if _better(new, old) else (old, new)
    seen = {"variant": other["variant"], "changed_s": other["changed_s"], "equal": other["equal"]}
    also = [*other.get("also_timed", []), *best.get("also_timed", []), seen]
    return {**best, "also_timed": also}


#: Rules timed only when asked for (``run --advise-compile``): compiling is costly.
ASKED_FOR = ("compiled-layer",)


def measure(seconds: float, compile: bool = False) -> List[str]:
    """Time every candidate change of every noted layer still alive, in ``seconds`` at most
    in all (each change gets an equal share of what is left; ``compile``: the compiled layer
    too; of a rule's several candidates on a layer, the better kept); the results are saved
    with the signals (:func:`~..core.meters.signals.set_trial`). Returns what was not timed,
    a line a layer, in words."""
    todo = []
    for layer, facts in signals.alive():
        for framework, rule, candidate in CANDIDATES:
            if rule in ASKED_FOR and not compile:
                continue
            if framework == facts["framework"] and rule not in facts["timed"]:
                todo.append((layer, facts, rule, candidate))
    late: Dict[str, List[str]] = {}
    failed: List[str] = []
    found: Dict[Tuple[int, str], Dict[str, Any]] = {}  # this call's, by layer and rule
    count = collections.Counter((id(layer), rule) for layer, _, rule, _ in todo)
    end = time.perf_counter() + seconds
    with untouched():
        for i, (layer, facts, rule, candidate) in enumerate(todo):
            left = end - time.perf_counter()
            name = f"{type(layer).__name__} ({getattr(layer, 'scope', None) or 'a layer'})"
            if left <= 0:
                if rule not in late.setdefault(name, []):
                    late[name].append(rule)
                continue
            label = rule
            try:
                change = candidate(layer, facts)
                if change is None:
                    continue
                if count[id(layer), rule] > 1 and change.variant:
                    label = f"{rule} ({change.variant})"
                share = left / (len(todo) - i)
                result = time_change(layer, facts["inputs"], change, share)
            except Unfit as unfit:
                failed.append(
                    f"{name}: {label} not timed: {unfit}, its share of the {seconds:g} s was"
                    f" {_said(share)} (--advise-seconds)"
                )
                continue
            except Exception as exc:  # a change that cannot be made here: said, not raised
                logger.info("advice: timing %s of %s failed: %s", label, name, exc)
                failed.append(f"{name}: {label} could not be timed: {type(exc).__name__}: {exc}")
                continue
            found[id(layer), rule] = _kept(result, found.get((id(layer), rule)))
            signals.set_trial(layer, rule, found[id(layer), rule])
    return failed + [
        f"{name}: not timed, no time left of the {seconds:g} s: {', '.join(rules)}"
        for name, rules in late.items()
    ]
