"""Where the instrumentation's cost goes on a GPU: host or device, the events or the code.

At arxiv's shape the device is busy and the host runs ahead of it, yet the defaults cost
3-5% of an epoch there (check's cost section; docs/performance.md, "GPU"), backward timing
off as much. This benchmark tells where that time goes. The study's 3-layer GCN with PyG
(check's cost section's model: ``commands.study``'s ``build_model`` and ``training_epoch``,
hidden ``--hidden``), full training epochs, at Cora's and arxiv's shapes (``--shapes``),
each variant its own copy of the model with the same weights, interleaved round by round
(the order reversed every other round):

- ``stock``: PyG's own ``GCNConv``;
- ``defaults``: ours, as a user gets them;
- ``no events``: ours, every CUDA step opened and closed with nothing recorded on the device
  (``core.clocks.events.native`` and ``record_event`` replaced, the C clock off: the copied
  code, labels, checks and anchors run, each step ends untimed);
- ``backward off``: ours with ``configure(backward=False)``;
- ``disabled``: ours inside ``configure(enabled=False)``;
- ``stock again``: a second stock copy (A/A: the noise floor).

For each epoch three times: the wall time (``perf_counter`` around the epoch and a
``torch.cuda.synchronize`` at its end), the device time (a ``torch.cuda.Event`` pair around
the epoch) and the host issue time (``perf_counter`` from the epoch's start to just before the
final synchronize). Printed per shape: each variant's medians and its medians of per-round
ratios to stock, and a conclusion computed from them: whether the added time is on the device
(device time up while the host issues the epoch in well under the device time) and whether it
comes from the events (``no events`` about stock) or from the code around them (``no events``
about ``defaults``). On the CPU (``--device cpu``) there are no events: wall and host time
only (``--quick``: tiny shapes, 3 rounds, for the tests).

    python benchmarks/device_cost.py --device cuda [--shapes cora arxiv] [--json FILE]
    python benchmarks/device_cost.py --device cpu --quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable, ContextManager, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_step import twin_clock  # noqa: E402
from launch_bound import device_of  # noqa: E402

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.commands.study.bench import _iqr, training_epoch  # noqa: E402
from instrumented_convs.commands.study.data import (  # noqa: E402
    SHAPES,
    scaled_shape,
    synthetic_graph,
)
from instrumented_convs.commands.study.models import build_model  # noqa: E402

VARIANTS = ("stock", "defaults", "no events", "backward off", "disabled", "stock again")
#: ``--shapes`` names and the study's generated graphs (``--quick``: this share of them).
GRAPHS = {"cora": "synthetic-cora", "arxiv": "synthetic-arxiv"}
QUICK_SCALE = {"cora": 0.1, "arxiv": 0.01}
#: Rounds per shape unless ``--rounds`` says.
ROUNDS = {"cora": 60, "arxiv": 40}
CLOCKS = ("wall", "device", "host")
#: The host issues an epoch "well under" its device time below this share of it.
HOST_WELL_UNDER = 0.8
#: The least noise a conclusion allows (a ratio's distance from another).
MIN_NOISE = 0.005


def _context(variant: str) -> Callable[[], ContextManager[Any]]:
    """What each variant's epoch runs inside (entered outside its timing)."""
    if variant == "no events":
        return lambda: twin_clock(record=False)
    if variant == "backward off":
        return lambda: ic.configure(backward=False)
    if variant == "disabled":
        return lambda: ic.configure(enabled=False)
    return contextlib.nullcontext


def _timer(device: torch.device) -> Callable[[Callable[[], None]], Dict[str, Optional[float]]]:
    """One epoch's wall, device and host issue times in seconds (device None on the CPU)."""
    if device.type != "cuda":

        def cpu(fn: Callable[[], None]) -> Dict[str, Optional[float]]:
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            return {"wall": t1 - t0, "device": None, "host": t1 - t0}

        return cpu
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream = torch.cuda.current_stream(device)

    def cuda(fn: Callable[[], None]) -> Dict[str, Optional[float]]:
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        start.record(stream)
        fn()
        end.record(stream)
        t1 = time.perf_counter()
        torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        return {"wall": t2 - t0, "device": start.elapsed_time(end) / 1e3, "host": t1 - t0}

    return cuda


def measure(
    shape: str, device: torch.device, rounds: int, warmup: int, hidden: int, quick: bool
) -> Dict[str, Any]:
    """Interleaved epochs of every variant at ``shape``: medians (ms) and ratios to stock."""
    name = GRAPHS[shape]
    dims = scaled_shape(name, QUICK_SCALE[shape]) if quick else SHAPES[name]
    data = synthetic_graph(name, **dims).to(device)
    torch.manual_seed(0)
    ours, graph = build_model("pyg", data, hidden=hidden)
    epochs: Dict[str, Callable[[], None]] = {}
    for v in VARIANTS:
        stock = v.startswith("stock")
        model = ours if v == "defaults" else build_model("pyg", data, hidden=hidden, stock=stock)[0]
        model.load_state_dict(ours.state_dict())
        epochs[v] = training_epoch(model.to(device), graph, data)
    contexts = {v: _context(v) for v in VARIANTS}
    timed = _timer(device)

    def run(v: str) -> Dict[str, Optional[float]]:
        with contexts[v]():
            return timed(epochs[v])

    for _ in range(warmup):
        for v in VARIANTS:
            run(v)
    times: Dict[str, Dict[str, List[float]]] = {v: {c: [] for c in CLOCKS} for v in VARIANTS}
    for r in range(rounds):
        for v in VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS)):
            for c, t in run(v).items():
                if t is not None:
                    times[v][c].append(t)
    ic.registry.reset()
    clocks = [c for c in CLOCKS if times["stock"][c]]
    median = {v: {c: statistics.median(times[v][c]) * 1e3 for c in clocks} for v in VARIANTS}
    ratios = {
        v: {c: [a / b for a, b in zip(times[v][c], times["stock"][c])] for c in clocks}
        for v in VARIANTS[1:]
    }
    ratio = {v: {c: statistics.median(x) for c, x in ratios[v].items()} for v in ratios}
    iqr = {v: {c: _iqr(x) for c, x in ratios[v].items()} for v in ratios}
    result = {
        "graph": name,
        "nodes": dims["num_nodes"],
        "edges": dims["num_edges"],
        "rounds": rounds,
        "median_ms": median,
        "ratio": ratio,
        "ratio_iqr": iqr,
    }
    result["conclusion"] = conclude(result, device.type == "cuda")
    return result


def conclude(result: Dict[str, Any], cuda: bool) -> Dict[str, Any]:
    """What the figures of one shape say: where the defaults' added time is (device or host)
    and what it comes from (the events, or the code around them)."""
    clock = "device" if cuda else "wall"
    r, med = result["ratio"], result["median_ms"]
    noise = max(
        MIN_NOISE,
        abs(r["stock again"][clock] - 1),
        result["ratio_iqr"]["defaults"][clock] / 2,
    )
    added = r["defaults"][clock] - 1
    added_no_events = r["no events"][clock] - 1
    out: Dict[str, Any] = {
        "clock": clock,
        "noise": noise,
        "added": added,
        "added_no_events": added_no_events,
        "added_backward_off": r["backward off"][clock] - 1,
    }
    parts: List[str] = []
    if cuda:
        share = med["defaults"]["host"] / med["defaults"]["device"]
        out["host_share"] = share
        out["device_side"] = added > noise and share < HOST_WELL_UNDER
        if added <= noise:
            parts.append(
                f"the defaults' device time is within the noise of stock's "
                f"({added:+.1%}, noise {noise:.1%})"
            )
        elif out["device_side"]:
            parts.append(
                f"the added time is on the device: device time {added:+.1%} while the host "
                f"issues the epoch in {share:.0%} of it"
            )
        else:
            parts.append(
                f"the added time is host time the device waits for: device time {added:+.1%}, "
                f"the host issuing for {share:.0%} of it"
            )
    else:
        out["host_share"] = None
        out["device_side"] = False
        out["source"] = "no events on the CPU"
        parts.append(
            f"no device here: the defaults add {added:+.1%} of host time (noise {noise:.1%}); "
            "no events to tell apart from the code"
        )
        out["text"] = "; ".join(parts)
        return out
    if added <= noise:
        out["source"] = "none measurable"
    elif added_no_events <= noise or added_no_events < 0.25 * added:
        out["source"] = "events"
        parts.append(f"it comes from the events (no events {added_no_events:+.1%}, about stock)")
    elif abs(added - added_no_events) <= noise or added_no_events > 0.75 * added:
        out["source"] = "code"
        parts.append(
            f"it comes from the code around the events (no events {added_no_events:+.1%}, "
            "about the defaults)"
        )
    else:
        out["source"] = "both"
        parts.append(
            f"both: without events {added_no_events / added:.0%} of it stays "
            f"(no events {added_no_events:+.1%})"
        )
    out["text"] = "; ".join(parts)
    return out


def table(shape: str, res: Dict[str, Any]) -> List[str]:
    """The printed lines of one shape: medians, ratios to stock, the conclusion."""
    clocks = list(res["median_ms"]["stock"])
    lines = [
        f"{shape} ({res['graph']}: {res['nodes']} nodes, {res['edges']} edges; "
        f"{res['rounds']} rounds), medians: ms an epoch and ratio to stock"
    ]
    lines.append(
        f"  {'variant':14s} "
        + " ".join(f"{c + ' ms':>11s}" for c in clocks)
        + " "
        + " ".join(f"{c:>8s}" for c in clocks)
    )
    for v in VARIANTS:
        q = res["ratio"].get(v, {c: 1.0 for c in clocks})
        lines.append(
            f"  {v:14s} "
            + " ".join(f"{res['median_ms'][v][c]:11.3f}" for c in clocks)
            + " "
            + " ".join(f"{q[c]:8.3f}" for c in clocks)
        )
    lines.append(f"  conclusion: {res['conclusion']['text']}")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    """Print a table per shape (and write JSON with --json)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--shapes", nargs="+", default=list(GRAPHS), choices=list(GRAPHS))
    p.add_argument("--rounds", type=int, help=f"interleaved rounds (default {ROUNDS})")
    p.add_argument("--warmup", type=int, default=2, help="untimed epochs per variant first")
    p.add_argument("--hidden", type=int, default=64, help="hidden width (check's cost: 64)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, 3 rounds: a smoke run")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    device = device_of(args.device)
    if device is None:
        return 2
    if args.quick:
        args.rounds, args.warmup = args.rounds or 3, 1
    torch.set_num_threads(1)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"Where the cost goes on {device} ({where}): the study's PyG GCN, hidden {args.hidden}, "
        f"full training epochs, variants interleaved; NVTX backend {ic.configure().nvtx}"
    )
    results: Dict[str, Any] = {}
    for shape in args.shapes:
        rounds = args.rounds or ROUNDS[shape]
        results[shape] = measure(shape, device, rounds, args.warmup, args.hidden, args.quick)
        print("\n".join(table(shape, results[shape])), flush=True)
    if args.json:
        info = {
            "device": str(device),
            "device_name": where,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "hidden": args.hidden,
            "quick": args.quick,
            "variants": list(VARIANTS),
        }
        with open(args.json, "w") as fh:
            json.dump({"info": info, "shapes": results}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
