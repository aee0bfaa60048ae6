"""What instrumentation costs where a GPU epoch is launch-bound: a tiny graph, full training steps.

On a GPU an epoch at Cora's size is launch-bound: the GPU waits for the CPU to issue the next
kernel, so every microsecond of Python per step lengthens the epoch. The CPU side of such an
epoch is measured here, on a graph so small that an epoch is almost all Python and dispatch:
256 nodes, 1,024 edges, 32 features, 7 classes, a 3-layer model of one conv class (hidden 32,
ReLU between layers, log_softmax), one thread, full training steps (zero_grad, forward,
nll_loss, backward, Adam step).

Variants, each its own copy of the model with the same weights, timed in interleaved rounds
(the order reversed every other round), each round a block of ``--block`` epochs per variant,
so that every timing includes its share of the calls whose backward is timed step by step
(one in ``backward_every``, see ``configure``); times are per epoch:

- ``stock``: the framework's own layers;
- ``defaults``: ours, as a user gets them (forward and backward rows, NVTX on);
- ``no statements``: the defaults with ``configure(statements=False)``: a generic layer's
  own statements and the functions its forward calls are not steps (what they cost);
- ``timeline``: the defaults with ``configure(timeline=...)`` on, as ``run`` has it (a new
  timeline each timing, so it never reaches its limit);
- ``no backward``: ours with ``configure(backward=False)``;
- ``disabled``: ours inside ``configure(enabled=False)``;
- ``1 in 10``: the duty cycle, ``configure(record_every=10)``: one training iteration in 10
  recorded as ``defaults``, the others on the stock code (its goal: at most ``defaults``'
  added time / 10, plus half a point, plus the A/A floor's distance from 1);
- ``budget 1%``: the duty cycle choosing its rate, ``configure(budget=0.01)`` (the rate it
  chose is printed; goal: at most 1.01 plus the A/A floor's distance from 1);
- ``none drawn``: the duty cycle at one in 10**9 (after its first iterations nothing is
  recorded): what the cycle itself costs, its hooks and switch;
- ``stock again``: a second stock copy: its ratio to ``stock`` is the noise floor (A/A).

torch.profiler is process-wide, so it runs in a phase of its own after the others: ``stock``
against ``stock`` inside ``torch.profiler.profile(activities=[CPU])``, interleaved the same
way (the profiler is entered and left outside the timed epoch).

Reported per layer: each variant's median epoch, the medians of per-round ratios to stock,
the rows recorded per epoch (forward and ``[backward]`` calls of steps) and the cost per
row: (variant - stock) / rows, in microseconds; beside it, the bare-Python floor of this
machine (a function call, ``perf_counter_ns()``, a ``with`` on a slotted object). What a row
costs at the least where rows are, between torch ops, is ``row_floor.py``'s.

    python benchmarks/launch_bound.py                    # every layer, 200 rounds
    python benchmarks/launch_bound.py --layers "PyG GCNConv" --rounds 50
    python benchmarks/launch_bound.py --quick            # a smoke run (CI)
    python benchmarks/launch_bound.py --device cuda      # on a GPU (scripts/gpu.sh runs it)

With ``--device cuda`` the models, features and graph live on the GPU and each timing ends
with ``torch.cuda.synchronize()`` (before the clock is read: a block's time is the GPU's
finished work, not its launches); the profiler phase records CUDA activity too (CUPTI), as a
user profiling a GPU run would. DGL needs a CUDA build of DGL there (it is skipped without).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import timeit
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

os.environ.setdefault("DGLBACKEND", "pytorch")

import instrumented_convs as ic  # noqa: E402

NODES, EDGES, FEATURES, CLASSES, HIDDEN = 256, 1024, 32, 7, 32
VARIANTS = (
    "stock",
    "defaults",
    "no statements",
    "timeline",
    "no backward",
    "disabled",
    "1 in 10",
    "budget 1%",
    "none drawn",
    "stock again",
)


class Net(torch.nn.Module):
    """Three layers of ``make(in, out)``: ReLU between them, log_softmax at the end."""

    def __init__(
        self, make: Callable[[int, int], torch.nn.Module], call: Callable[..., Any]
    ) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [make(FEATURES, HIDDEN), make(HIDDEN, HIDDEN), make(HIDDEN, CLASSES)]
        )
        self.call = call

    def forward(self, x: torch.Tensor, graph: Any) -> torch.Tensor:
        for conv in self.convs[:-1]:
            x = F.relu(self.call(conv, x, graph))
        return F.log_softmax(self.call(self.convs[-1], x, graph), dim=-1)


def _pyg(name: str, sparse: bool = False) -> Callable[[], Tuple[Any, Any, Any]]:
    def build() -> Tuple[Any, Any, Any]:
        import torch_geometric.nn as stock_nn

        import instrumented_convs.pyg as ours_nn

        def make(mod: Any) -> Callable[[int, int], torch.nn.Module]:
            cls = getattr(mod, name)
            if name == "GINConv":
                return lambda i, o: cls(
                    torch.nn.Sequential(
                        torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o)
                    )
                )
            if name == "GATConv":
                return lambda i, o: cls(i, o, heads=1)
            return lambda i, o: cls(i, o)

        g = torch.Generator().manual_seed(0)
        ei = torch.randint(0, NODES, (2, EDGES), generator=g)
        graph: Any = ei
        if sparse:
            from torch_sparse import SparseTensor

            graph = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(NODES, NODES))
        call = lambda conv, x, graph: conv(x, graph)  # noqa: E731
        return make(stock_nn), make(ours_nn), (graph, call)

    return build


def _dgl(name: str) -> Callable[[], Tuple[Any, Any, Any]]:
    def build() -> Tuple[Any, Any, Any]:
        import dgl
        import dgl.nn as stock_nn

        import instrumented_convs.dgl as ours_nn

        def make(mod: Any) -> Callable[[int, int], torch.nn.Module]:
            cls = getattr(mod, name)
            if name == "SAGEConv":
                return lambda i, o: cls(i, o, "mean")
            if name == "GATConv":
                return lambda i, o: cls(i, o, num_heads=1)
            return lambda i, o: cls(i, o)

        g = torch.Generator().manual_seed(0)
        ei = torch.randint(0, NODES, (2, EDGES), generator=g)
        graph = dgl.add_self_loop(dgl.remove_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=NODES)))
        if name == "GATConv":
            call = lambda conv, x, graph: conv(graph, x).flatten(1)  # noqa: E731
        else:
            call = lambda conv, x, graph: conv(graph, x)  # noqa: E731
        return make(stock_nn), make(ours_nn), (graph, call)

    return build


#: The layers of the goal: label -> builder of (stock maker, our maker, (graph, call)).
LAYERS: Dict[str, Callable[[], Tuple[Any, Any, Any]]] = {
    "PyG GCNConv": _pyg("GCNConv"),
    "PyG GCNConv, SparseTensor": _pyg("GCNConv", sparse=True),
    "PyG SAGEConv": _pyg("SAGEConv"),
    "PyG GATConv": _pyg("GATConv"),
    "PyG GINConv": _pyg("GINConv"),
    "DGL GraphConv": _dgl("GraphConv"),
    "DGL SAGEConv": _dgl("SAGEConv"),
    "DGL GATConv": _dgl("GATConv"),
}


def _epoch(
    model: torch.nn.Module, x: torch.Tensor, graph: Any, y: torch.Tensor
) -> Callable[[], None]:
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def epoch() -> None:
        opt.zero_grad()
        out = model(x, graph)
        F.nll_loss(out, y).backward()
        opt.step()

    return epoch


BLOCK = 16  # epochs per timing (--block)
DEVICE = torch.device("cpu")  # where the models run (--device)


def _sync() -> None:
    """Wait for the GPU's queued work (``--device cuda``); nothing on the CPU."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def _timed(fn: Callable[[], None]) -> float:
    """Microseconds per epoch over a block of ``BLOCK`` epochs (on CUDA, until the GPU has
    finished them: the queue is drained before the first and after the last)."""
    _sync()
    t0 = time.perf_counter_ns()
    for _ in range(BLOCK):
        fn()
    _sync()
    return (time.perf_counter_ns() - t0) / 1e3 / BLOCK


def _rows_per_epoch(epoch: Callable[[], None]) -> Tuple[int, int]:
    """Forward and backward rows (calls of steps, timed or not) one epoch records."""
    ic.registry.reset()
    epoch()
    fwd = bwd = 0
    for e in ic.registry.entries():
        n = e.count + e.untimed + e.skipped
        if e.phase == "backward":
            bwd += n
        else:
            fwd += n
    ic.registry.reset()
    return fwd, bwd


def _interleave(
    variants: Dict[str, Callable[[], float]], rounds: int, warmup: int
) -> Dict[str, List[float]]:
    names = list(variants)
    for _ in range(warmup):
        for v in names:
            variants[v]()
    times: Dict[str, List[float]] = {v: [] for v in names}
    for r in range(rounds):
        for v in names if r % 2 == 0 else reversed(names):
            times[v].append(variants[v]())
    return times


def variant_models(
    label: str, variants: Sequence[str], ours: Callable[[str], bool]
) -> Tuple[Dict[str, torch.nn.Module], Dict[str, Callable[[], None]], Tuple[Any, ...]]:
    """One model per variant of layer ``label``, all with the same weights (ours where
    ``ours(variant)``, else stock), their epochs, and ``(make_stock, x, graph, y, call,
    reference state)`` for models made later (the benchmarks of this folder share it)."""
    make_stock, make_ours, (graph, call) = LAYERS[label]()
    torch.manual_seed(0)
    x = torch.randn(NODES, FEATURES).to(DEVICE)
    y = torch.randint(0, CLASSES, (NODES,)).to(DEVICE)
    graph = graph.to(DEVICE)  # an edge_index, a SparseTensor or a DGL graph
    torch.manual_seed(1)
    ref = Net(make_stock, call)
    models = {}
    for v in variants:
        m = Net(make_ours if ours(v) else make_stock, call)
        m.load_state_dict(ref.state_dict())
        models[v] = m.to(DEVICE)
    epochs = {v: _epoch(m, x, graph, y) for v, m in models.items()}
    return models, epochs, (make_stock, x, graph, y, call, ref.state_dict())


def measure(label: str, rounds: int, warmup: int, profiler: bool = True) -> Dict[str, Any]:
    """Interleaved epochs of every variant of one layer; then the profiler phase."""
    _, epochs, (make_stock, x, graph, y, call, state) = variant_models(
        label, VARIANTS, lambda v: not v.startswith("stock")
    )

    def no_backward() -> float:
        saved = ic.configure()
        ic.configure(backward=False)
        try:
            return _timed(epochs["no backward"])
        finally:
            saved.restore()

    def disabled() -> float:
        with ic.configure(enabled=False):
            return _timed(epochs["disabled"])

    def no_statements() -> float:
        with ic.configure(statements=False):
            return _timed(epochs["no statements"])

    def timeline() -> float:
        with ic.configure(timeline=10_000_000):  # on: a new, empty timeline; off at the end
            return _timed(epochs["timeline"])

    def cycled(variant: str, **how: Any) -> Callable[[], float]:
        def run() -> float:  # the cycle goes on where it stopped (its draw, its budget)
            with ic.configure(**how):
                return _timed(epochs[variant])

        return run

    variants = {
        "stock": lambda: _timed(epochs["stock"]),
        "defaults": lambda: _timed(epochs["defaults"]),
        "no statements": no_statements,
        "timeline": timeline,
        "no backward": no_backward,
        "disabled": disabled,
        "1 in 10": cycled("1 in 10", record_every=10),
        "budget 1%": cycled("budget 1%", budget=0.01),
        "none drawn": cycled("none drawn", record_every=10**9),
        "stock again": lambda: _timed(epochs["stock again"]),
    }
    ic.registry.reset()
    times = _interleave(variants, rounds, warmup)
    with ic.configure(budget=0.01):
        chosen = ic.registry.summary().sampling["every"]  # the rate the budget ended at
    fwd, bwd = _rows_per_epoch(epochs["defaults"])
    with ic.configure(statements=False):
        fwd_ns, bwd_ns = _rows_per_epoch(epochs["no statements"])
    saved = ic.configure()
    ic.configure(backward=False)
    try:
        fwd_only, _ = _rows_per_epoch(epochs["no backward"])
    finally:
        saved.restore()
    ic.registry.reset()
    out: Dict[str, Any] = {
        "rounds": rounds,
        "budget_every": chosen,
        "rows": {
            "defaults": fwd + bwd,
            "forward": fwd,
            "backward": bwd,
            "no backward": fwd_only,
            "no statements": fwd_ns + bwd_ns,
        },
    }
    if profiler:
        from torch.profiler import ProfilerActivity, profile

        prof_model = Net(make_stock, call)
        prof_model.load_state_dict(state)
        prof_epoch = _epoch(prof_model.to(DEVICE), x, graph, y)
        activities = [ProfilerActivity.CPU]
        if DEVICE.type == "cuda":
            activities.append(ProfilerActivity.CUDA)

        def profiled() -> float:
            with profile(activities=activities):
                return _timed(prof_epoch)

        ptimes = _interleave(
            {"stock": lambda: _timed(epochs["stock"]), "profiler": profiled},
            max(rounds // 4, 3),
            max(warmup // 2, 1),
        )
        times["stock (profiler phase)"] = ptimes["stock"]
        times["torch.profiler"] = ptimes["profiler"]
    out["median_us"] = {v: statistics.median(t) for v, t in times.items()}
    ratio = lambda a, b: statistics.median([x / y for x, y in zip(times[a], times[b])])  # noqa: E731
    diff = lambda a, b: statistics.median([x - y for x, y in zip(times[a], times[b])])  # noqa: E731
    out["ratio"] = {v: ratio(v, "stock") for v in VARIANTS[1:]}
    out["extra_us"] = {v: diff(v, "stock") for v in VARIANTS[1:]}
    if profiler:
        out["ratio"]["torch.profiler"] = ratio("torch.profiler", "stock (profiler phase)")
        out["extra_us"]["torch.profiler"] = diff("torch.profiler", "stock (profiler phase)")
    out["us_per_row"] = {
        "defaults": out["extra_us"]["defaults"] / max(fwd + bwd, 1),
        "timeline": diff("timeline", "defaults") / max(fwd + bwd, 1),
        # what the rows of statements and routed functions cost, each
        "statements": diff("defaults", "no statements") / max(fwd + bwd - fwd_ns - bwd_ns, 1),
        "no backward": out["extra_us"]["no backward"] / max(fwd_only, 1),
    }
    return out


def cycle_goal(ratio: Dict[str, float]) -> float:
    """The duty cycle's goal at one in 10: the full mode's added time / 10, plus half a
    point, plus the A/A floor's distance from 1."""
    return 1 + (ratio["defaults"] - 1) / 10 + 0.005 + abs(ratio["stock again"] - 1)


def write_json(path: str, results: Dict[str, Any], **info: Any) -> None:
    """Write ``{"info": ..., "results": results}`` to ``path``: the machine, the versions and
    the device with ``info`` (the benchmarks of this folder share it)."""
    name = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "CPU"
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "device": str(DEVICE),
        "device_name": name,
        **info,
    }
    with open(path, "w") as fh:
        json.dump({"info": info, "results": results}, fh, indent=2)


def device_of(name: str) -> Optional[torch.device]:
    """The device ``--device name`` asks for; ``None`` (said on stderr) when it is CUDA and
    torch sees none. The benchmarks of this folder that run on a GPU share it."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {name}, but torch sees no CUDA device", file=sys.stderr)
        return None
    return device


def python_floor() -> Dict[str, float]:
    """This machine's bare-Python costs, ns: a call, ``perf_counter_ns()``, a slotted ``with``."""

    class Slotted:
        __slots__ = ("t",)

        def __enter__(self) -> "Slotted":
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

    def f() -> None:
        return None

    s = Slotted()
    n = 200_000
    ns = lambda stmt, g: min(timeit.repeat(stmt, globals=g, number=n, repeat=5)) / n * 1e9  # noqa: E731
    loop = ns("pass", {})
    return {
        "function call": ns("f()", {"f": f}) - loop,
        "perf_counter_ns()": ns("p()", {"p": time.perf_counter_ns}) - loop,
        "with on a slotted object": ns("with s: pass", {"s": s}) - loop,
    }


def main(argv: Optional[List[str]] = None) -> int:
    """Print the table (and write JSON with --json)."""
    global BLOCK, DEVICE
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--layers",
        nargs="+",
        default=list(LAYERS),
        choices=list(LAYERS),
        metavar="LAYER",
        help="any of: " + ", ".join(repr(k) for k in LAYERS),
    )
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    p.add_argument("--block", type=int, default=16, help="epochs per timing")
    p.add_argument("--no-profiler", action="store_true", help="skip the torch.profiler phase")
    p.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up: a smoke run")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.block = 3, 1, 2
    BLOCK = args.block
    device = device_of(args.device)
    if device is None:
        return 2
    DEVICE = device
    torch.set_num_threads(1)
    floor = python_floor()
    where = "CPU" if DEVICE.type == "cpu" else f"{DEVICE}, {torch.cuda.get_device_name(DEVICE)}"
    print(
        f"Launch-bound proxy on {where}: 3 layers, {NODES} nodes, {EDGES} edges, "
        f"{FEATURES} features, full training steps, 1 thread; medians of {args.rounds} "
        f"interleaved rounds of {BLOCK} epochs; NVTX backend {ic.configure().nvtx}; "
        f"backward_every {ic.configure().backward_every}"
    )
    print("  bare-Python floor, ns: " + ", ".join(f"{k} {v:.0f}" for k, v in floor.items()))
    print(
        f"  {'layer':27s} {'stock us':>9s} {'defaults':>9s} {'no stmts':>8s} "
        f"{'timeline':>9s} {'no bw':>7s} "
        f"{'disabled':>9s} {'profiler':>9s} "
        f"{'A/A':>6s} {'rows':>5s} {'us/row':>7s} {'tl us/row':>9s} {'rows nb':>7s} "
        f"{'us/row nb':>9s} {'1 in 10':>8s} {'goal':>6s} {'budget':>7s} {'K':>4s} "
        f"{'none':>6s}"
    )
    results: Dict[str, Any] = {}
    for label in args.layers:
        try:
            r = measure(label, args.rounds, args.warmup, profiler=not args.no_profiler)
        except ImportError as exc:
            print(f"  {label:27s} skipped: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001
            if not (label.startswith("DGL") and DEVICE.type == "cuda"):
                raise
            # PyPI's DGL wheels are CPU-only: moving a graph to the GPU raises DGLError
            print(f"  {label:27s} skipped: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        results[label] = r
        q = r["ratio"]
        print(
            f"  {label:27s} {r['median_us']['stock']:9.0f} {q['defaults']:9.3f} "
            f"{q['no statements']:8.3f} {q['timeline']:9.3f} {q['no backward']:7.3f} "
            f"{q['disabled']:9.3f} {q.get('torch.profiler', float('nan')):9.3f} "
            f"{q['stock again']:6.3f} "
            f"{r['rows']['defaults']:5d} {r['us_per_row']['defaults']:7.2f} "
            f"{r['us_per_row']['timeline']:9.2f} {r['rows']['no backward']:7d} "
            f"{r['us_per_row']['no backward']:9.2f} {q['1 in 10']:8.3f} "
            f"{cycle_goal(q):6.3f} {q['budget 1%']:7.3f} {r['budget_every']:4d} "
            f"{q['none drawn']:6.3f}",
            flush=True,
        )
    if args.json:
        write_json(args.json, results, nvtx_backend=ic.configure().nvtx, python_floor_ns=floor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
