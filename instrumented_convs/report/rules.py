"""The advice's rules: what to change, decided from the record: the rows (by layer), the
layers' signals (``configure(advise=True)``) with the changes timed on them at the end
(``layers.trials``: part 2), the loaders' waits and the host and device verdict. A rule is one entry
of :data:`RULES`: its id and the function that reads the record into items; docs/advice.md
gives each rule's evidence, condition and number.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import takewhile
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import hostdevice

__all__ = ["MIN_SHARE", "Record", "Rule", "RULES", "decide", "lines"]

#: An item is given when what it puts at stake is at least this share of the recorded time.
MIN_SHARE = 0.05

#: The constructor's positional arguments as the advice writes them, per class (another
#: PyG class: PyG's ``in_channels, out_channels``).
_POSITIONAL = {
    "GCNConv": ("in_channels", "out_channels"),
    "APPNP": ("K", "alpha"),
    "GCN2Conv": ("channels", "alpha"),
    "GraphConv": ("in_feats", "out_feats"),
}
_PYG_POSITIONAL = ("in_channels", "out_channels")
#: Options the advice leaves out where they have this default (the others noted are
#: written as they were).
_DEFAULTS = {
    "improved": False,
    "add_self_loops": True,
    "normalize": True,
    "norm": "both",
    "cached": False,
    "allow_zero_in_degree": False,
}


@dataclass
class Record:
    """What the rules read: a ``summary`` by layer, the layers' ``signals`` (or None: not
    recorded), the run's ``loaders`` section (``run.json``'s ``workers``) and ``iterations``
    (None where the run does not know them)."""

    summary: Any
    signals: Optional[Dict[str, Any]] = None
    loaders: Optional[Dict[str, Any]] = None
    iterations: Optional[int] = None


@dataclass(frozen=True)
class Rule:
    """A rule: its ``id`` and ``decide(record)``, the items it finds (any share)."""

    id: str
    decide: Callable[[Record], List[Dict[str, Any]]]


def _share(record: Record, seconds: float) -> float:
    total = record.summary.total
    return seconds / total if total > 0 else 0.0


def _duration(seconds: float) -> str:
    """``3.71 ms``, ``12.4 s``: a time as the table would read it."""
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def _time_in(summary: Any, scope: Optional[str], steps: Sequence[str]) -> float:
    """The time of ``scope``'s rows named one of ``steps`` (the outermost of each, forward
    and backward), in seconds."""
    seconds, inside = 0.0, -1
    for r in summary.rows:
        if inside >= 0 and r.depth > inside:
            continue
        inside = -1
        if r.scope == scope and r.step in steps:
            seconds += r.total
            inside = r.depth
    return seconds


def _ctor(item: Dict[str, Any], **change: Any) -> str:
    """The layer's constructor call with ``change``: its positional arguments (up to the
    first not noted) and the options it has away from their defaults, as it was built."""
    rest = dict(item["options"])
    given = takewhile(rest.__contains__, _POSITIONAL.get(item["class"], _PYG_POSITIONAL))
    args = [repr(rest.pop(k)) for k in list(given)]
    kept = {k: v for k, v in rest.items() if k not in _DEFAULTS or v != _DEFAULTS[k]}
    kept.update(change)
    args += [f"{k}={v!r}" for k, v in kept.items()]
    return f"{item['class']}({', '.join(args)})"


def _item(
    rule: str,
    layers: List[Dict[str, Any]],
    change: str,
    why: str,
    valid_when: str,
    seconds: float,
    outputs: str,
    record: Record,
) -> Dict[str, Any]:
    out = {
        "rule": rule,
        "layers": [{"path": x.get("path"), "class": x["class"]} for x in layers],
        "change": change,
        "why": why,
        "valid_when": valid_when,
        "at_stake_share": _share(record, seconds),
        "at_stake": "an upper bound: the time of the steps the change removes or replaces",
        "measured_saving_share": None,
        "outputs": outputs,
    }
    if record.iterations:
        out["at_stake_per_iteration_s"] = seconds / record.iterations
    return out


def _layers(record: Record, framework: str) -> List[Dict[str, Any]]:
    return [x for x in (record.signals or {}).get("layers", ()) if x["framework"] == framework]


def cache_normalization(record: Record) -> List[Dict[str, Any]]:
    """A PyG layer whose ``cached=True`` keeps its normalised graph, not cached, normalising
    the same graph at every call: ``gcn_norm``'s time is at stake."""
    out = []
    for x in _layers(record, "pyg"):
        opts = x.get("options", {})
        if not x.get("caches_graph", True):  # (a run from before noted only those)
            continue
        if opts.get("cached") is not False or not opts.get("normalize", True):
            continue
        if x["calls"] < 2 or not x["same_graph"]:
            continue
        seconds = _time_in(record.summary, x["path"], ("gcn_norm",))
        if seconds <= 0:
            continue
        out.append(
            _item(
                "cache-normalization",
                [x],
                _ctor(x, cached=True),
                f"normalised the same graph in each of its {x['calls']} calls",
                "the graph never changes between calls (transductive training)",
                seconds,
                "equal",
                record,
            )
        )
    return out


def self_loops_present(record: Record) -> List[Dict[str, Any]]:
    """Self-loops added to a graph in which every node has one (PyG), or DGL's check for nodes
    without an in-edge on a graph with none: the step's time is at stake."""
    out = []
    for x in _layers(record, "pyg"):
        opts = x.get("options", {})
        if not opts.get("add_self_loops") or x.get("self_loop_nodes") != x.get("nodes"):
            continue
        seconds = _time_in(
            record.summary, x["path"], ("add_remaining_self_loops", "add_self_loops")
        )
        if seconds > 0:
            out.append(
                _item(
                    "self-loops-present",
                    [x],
                    _ctor(x, add_self_loops=False),
                    f"added self-loops to a graph whose {x['nodes']} nodes all had one",
                    "every graph the layer sees has a self-loop on every node",
                    seconds,
                    "equal up to the order of summation (the loops' weights are kept)",
                    record,
                )
            )
    for x in _layers(record, "dgl"):
        opts = x.get("options", {})
        if opts.get("allow_zero_in_degree", True) or x.get("zero_in_degree_nodes") != 0:
            continue
        seconds = _time_in(record.summary, x["path"], ("zero_in_degree_check",))
        if seconds > 0:
            out.append(
                _item(
                    "self-loops-present",
                    [x],
                    _ctor(x, allow_zero_in_degree=True),
                    "checked for nodes without an in-edge at every call; its last graph had none",
                    "no graph the layer sees has a node without an in-edge (self-loops added)",
                    seconds,
                    "equal (the check only raises)",
                    record,
                )
            )
    return out


def loader_workers(record: Record) -> List[Dict[str, Any]]:
    """The loop waited for a loader: its own wait is at stake."""
    out = []
    for loader in (record.loaders or {}).get("loaders", ()):
        wait = loader.get("wait", 0) * 1e-9
        if wait <= 0:
            continue
        n = loader.get("workers")
        if n:
            change = (
                f"more workers than {n} (num_workers), persistent_workers=True, "
                "pin_memory=True on CUDA; PyG's filter_per_worker, DGL's use_uva"
            )
        else:
            change = (
                "num_workers=4 (or more), persistent_workers=True, pin_memory=True "
                "on CUDA; PyG's filter_per_worker, DGL's use_uva"
            )
        item = _item(
            "loader-workers",
            [{"path": loader.get("label"), "class": "loader"}],
            change,
            f"the loop waited {_duration(wait)} for {loader.get('label')}'s batches",
            "the loader's work can run beside the training (its batches do not depend on "
            "the step before)",
            wait,
            "equal (the same batches, in the same order)",
            record,
        )
        out.append(item)
    return out


def host_bound(record: Record) -> List[Dict[str, Any]]:
    """On CUDA, a region the device waited in for the host: its host time is at stake."""
    out = []
    for part in hostdevice.parts(record.summary)["regions"]:
        if part.verdict != "launch-bound" or part.host <= 0:
            continue
        out.append(
            _item(
                "host-bound",
                [{"path": part.name, "class": part.what}],
                "fewer, larger launches: torch.compile(model), CUDA graphs, a larger batch or "
                "width",
                f"the device caught up with the host at {part.caught_share:.0%} of "
                f"{part.calls} calls",
                "the model's shapes are static enough to compile or capture",
                part.host,
                "equal up to rounding when compiled or captured; a larger batch or width is a "
                "different model",
                record,
            )
        )
    return out


def saves(trial: Dict[str, Any]) -> bool:
    """Whether a change timed by ``layers.trials`` saved time: its outputs equal, and the
    median over rounds of what it saved against the faster of the round's two stock calls
    more than the A/A's median difference. Round by round, not two medians apart: a busy
    moment tips one round, where it could tip a median of separately timed calls (CI once
    advised bfloat16 on a CPU where it is slower). A record without rounds: the medians."""
    saved = trial.get("paired_saving_s", trial["stock_s"] - trial["changed_s"])
    return bool(trial["equal"]) and saved > trial["aa_s"]


def _timed(
    record: Record,
    rule: str,
    framework: str,
    given: str,
    valid_when: str,
    paying: Optional[Callable[[Dict[str, Any]], float]] = None,
) -> List[Dict[str, Any]]:
    """The items of a change timed on the layers' own inputs (``layers.trials``), each where
    it saved time (:func:`saves`): that saving a call,
    scaled to the layer's recorded time, less the conversion (once where the graph stayed,
    else at every call), its ``measured_saving_share``; ``given``: what the change gives the
    layer, in words; ``paying(layer)``: the share of its calls the change saves in (all)."""
    out = []
    for x in _layers(record, framework):
        t = (x.get("trials") or {}).get(rule)
        if not t or not saves(t):
            continue
        seconds = _time_in(record.summary, x["path"], (x["class"],))
        seconds *= 1.0 if paying is None else paying(x)
        convert = t["convert_s"] * (1 if x["same_graph"] or t.get("convert_once") else x["calls"])
        saving = seconds * (t["stock_s"] - t["changed_s"]) / t["stock_s"] - convert
        if saving <= 0:  # nothing recorded, or the conversion costs what the change saves
            continue
        item = _item(
            rule,
            [x],
            t["change"],
            f"timed on its own last inputs, forward and backward: "
            f"{_duration(t['stock_s'])} a call as it is, {_duration(t['changed_s'])} "
            f"{given} (A/A {_duration(t['aa_s'])}, faster in "
            f"{t.get('faster_rounds', t['rounds'])} of {t['rounds']} rounds)"
            + _made(t, x)
            + _also(t),
            valid_when,
            seconds,
            _outputs(t),
            record,
        )
        item["measured_saving_share"] = _share(record, saving)
        out.append(item)
    return out


def _made(t: Dict[str, Any], layer: Dict[str, Any]) -> str:
    """What making the change costs the run, in words (nothing where it costs nothing)."""
    if not t["convert_s"]:
        return ""
    once = t.get("convert_once") or layer["same_graph"]
    return f"; making it took {_duration(t['convert_s'])}{' once' if once else ' a call'}"


def _also(t: Dict[str, Any]) -> str:
    """The rule's other candidates timed on the layer, in words (nothing where none)."""
    others = [
        f"{o['variant']} {_duration(o['changed_s'])}" + ("" if o["equal"] else " (not equal)")
        for o in t.get("also_timed", [])
    ]
    if not others:
        return ""
    return f"; timed too: {', '.join(others)} a call; this is {t.get('variant') or 'the faster'}"


def _outputs(t: Dict[str, Any]) -> str:
    """How a timed change's outputs and gradients compared with the layer's."""
    tolerance = t.get("tolerance", 1e-4)
    if tolerance <= 1e-4:
        return (
            f"equal: the largest difference {t['difference']:.1e} of the largest value (within "
            "1e-4: sums in another order)"
        )
    return (
        f"different: the largest difference {t['difference']:.1e} of the largest value, "
        f"within the {tolerance:.0e} taken as the same model; check the accuracy you train to"
    )


def fused_sparse(record: Record) -> List[Dict[str, Any]]:
    """A PyG layer with a fused ``message_and_aggregate`` given ``edge_index``: ``adj_t``,
    where timed faster on its own inputs."""
    return _timed(
        record,
        "fused-sparse",
        "pyg",
        "given adj_t",
        "the layer's graph can be given as a sparse matrix (adj_t); made once where it never "
        "changes",
    )


def cached_norm_dgl(record: Record) -> List[Dict[str, Any]]:
    """A DGL ``GraphConv`` normalising by the degrees at every call: the weights normalised
    once (``EdgeWeightNorm``) and ``norm='none'``, where timed faster on its own inputs."""
    return _timed(
        record,
        "cache-normalization",
        "dgl",
        "with the weights normalised once",
        "the weights are made once per graph (a new graph needs its own: EdgeWeightNorm again)",
    )


def graph_formats(record: Record) -> List[Dict[str, Any]]:
    """A DGL ``GraphConv`` given the same graph made anew at its calls, its sparse formats made
    inside each: one graph made once, where timed faster (the calls after the first)."""

    def paying(x: Dict[str, Any]) -> float:
        if not x.get("graph_remade"):  # (graphs that differ: each needs its formats)
            return 0.0
        return max(x.get("fresh_graph_calls", 0) - 1, 0) / max(x["calls"], 1)

    return _timed(
        record,
        "graph-formats",
        "dgl",
        "given one graph whose formats were made",
        "the graph is the same at every call: its last two were (made anew inside the loop: "
        "dgl.add_self_loop, dgl.graph or .to() there)",
        paying,
    )


def project_first(record: Record) -> List[Dict[str, Any]]:
    """A PyG SAGEConv, GraphConv or GINConv summing at a width much larger than its output's:
    the projection moved before the sum, where timed faster on its own inputs."""
    return _timed(
        record,
        "project-first",
        "pyg",
        "projected first",
        "the layer's sum is linear (add, sum, mean) and its input a feature matrix",
    )


def lower_precision(record: Record) -> List[Dict[str, Any]]:
    """A layer timed faster under bfloat16 autocast on its own inputs, its outputs within the
    tolerance (``layers.precision``); PyG and DGL alike."""
    return [
        item
        for framework in ("pyg", "dgl")
        for item in _timed(
            record,
            "lower-precision",
            framework,
            "under bfloat16 autocast",
            "the accuracy the model trains to holds in bfloat16 (check it on a validation set)",
        )
    ]


def compiled_layer(record: Record) -> List[Dict[str, Any]]:
    """A layer timed faster compiled (``run --advise-compile``), its compilation counted once."""
    return [
        item
        for framework in ("pyg", "dgl")
        for item in _timed(
            record,
            "compiled-layer",
            framework,
            "compiled",
            "the layer's shapes stay as they were (a new shape compiles again, unless dynamic)",
        )
    ]


#: The rules, in the order their items are listed when their shares tie.
RULES = (
    Rule("fused-sparse", fused_sparse),
    Rule("project-first", project_first),
    Rule("lower-precision", lower_precision),
    Rule("compiled-layer", compiled_layer),
    Rule("cache-normalization", cache_normalization),
    Rule("cache-normalization", cached_norm_dgl),
    Rule("graph-formats", graph_formats),
    Rule("self-loops-present", self_loops_present),
    Rule("loader-workers", loader_workers),
    Rule("host-bound", host_bound),
)


def decide(record: Record, min_share: float = MIN_SHARE) -> List[Dict[str, Any]]:
    """Every rule's items worth ``min_share`` of the recorded time or more, alone or with the
    rule's other items under it (the same change to three layers, 2% each), largest first."""
    items: List[Dict[str, Any]] = []
    for rule in RULES:
        found = rule.decide(record)
        small = [i for i in found if i["at_stake_share"] < min_share]
        keep_small = small and sum(i["at_stake_share"] for i in small) >= min_share
        items += [i for i in found if keep_small or i["at_stake_share"] >= min_share]
    return sorted(items, key=lambda i: -i["at_stake_share"])


def lines(items: Sequence[Dict[str, Any]], min_share: float = MIN_SHARE) -> List[str]:
    """The section's text: "What to change", an item a paragraph, largest first."""
    out = ["What to change"]
    if not items:
        return out + [f"  nothing worth {min_share:.0%} or more of the recorded time"]
    for i in items:
        where = ", ".join(f"{x['path']} ({x['class']})" for x in i["layers"])
        if i.get("ranks") is not None:
            where += f" on ranks {', '.join(map(str, i['ranks']))}"
        saved = i.get("measured_saving_share")
        timed = f", {saved:.0%} saved as timed" if saved is not None else ""
        out.append(
            f"  {i['at_stake_share']:.0%} at stake (at most){timed} in {where}: {i['change']}"
        )
        out.append(f"    why: {i['why']}; valid when {i['valid_when']}; outputs {i['outputs']}")
    return out
