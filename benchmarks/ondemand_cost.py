"""What on demand costs while nothing is asked, and what a capture's iterations cost, measured
in several fresh processes a layer.

Idle, at the launch-bound proxy of ``benchmarks/launch_bound.py`` (3 layers of one conv
class, 256 nodes, full training steps, one thread): ``stock``, ``none drawn`` (the duty
cycle at one in 10**9: its hooks and switch alone), ``on demand`` (the mode on, nothing
asked), ``threads`` (stock with two more threads blocked as the listener's are, started
before the block) and ``stock again`` (the A/A floor), in interleaved rounds of
``--block`` epochs, each after two untimed ones, the order drawn afresh each round (with
the order only reversed every other round a variant always follows the same neighbour,
and what switching that one leaves behind read as its cost: docs/performance.md); per
layer the median over the processes of each variant's median ratio to stock [min-max].
The process listens for captures all along, as a job on demand does: its two threads are
there for every variant (the mode is switched in the core, not by starting them).

Then, in the same processes, each iteration timed on its own: stock's, and the instrumented
model's in blocks on demand (idle, ``--pause`` iterations; a capture of ``--capture``
iterations asked through the core, after its warm-up iteration; the iterations while its
folder is written, by the writer's process) and in blocks of the duty cycle at one in
``--pause`` (its iterations recorded after a pause, and the others); each kind's median
over stock's median.

``--cora``: the idle variants on the study's 3-layer GCN at Cora's shape (PyG edge_index),
interleaved epochs, a process.

    python benchmarks/ondemand_cost.py                                # four PyG layers
    python benchmarks/ondemand_cost.py --layers "PyG GCNConv" --processes 5 --cora
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bound as lb  # noqa: E402
import processes  # noqa: E402

import instrumented_convs as ic  # noqa: E402
from instrumented_convs import core  # noqa: E402
from instrumented_convs.commands.launch import ondemand  # noqa: E402
from instrumented_convs.core.dutycycle.cycle import cycle  # noqa: E402
from instrumented_convs.core.settings import switches  # noqa: E402

VARIANTS = ("stock", "none drawn", "on demand", "threads", "stock again")
LAYERS = ("PyG GCNConv", "PyG SAGEConv", "PyG GINConv", "PyG GATConv")
KINDS = ("idle", "warm-up", "captured", "writing", "cycle drawn", "cycle not drawn")
PAUSE, CAPTURE = 10, 5  # (--pause, --capture)
SETTLE = 2  # untimed epochs before each timed block


@contextlib.contextmanager
def _on_demand() -> Iterator[None]:
    """The mode on, with the process's listener as it is (see the module docstring)."""
    cycle.start(demand=True)
    try:
        yield
    finally:
        cycle.stop()


@contextlib.contextmanager
def _threads() -> Iterator[None]:
    """Two more threads blocked as the listener's are: one in accept(), one on a queue."""
    import queue
    import socket
    import threading

    path = os.path.join(tempfile.mkdtemp(prefix="ondemand-threads-"), "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(1)
    q: "queue.Queue[Any]" = queue.Queue()
    ready = [threading.Event(), threading.Event()]

    def accept() -> None:
        ready[0].set()
        try:
            sock.accept()
        except OSError:
            return

    def get() -> None:
        ready[1].set()
        q.get()

    threads = [threading.Thread(target=accept), threading.Thread(target=get)]
    for t, r in zip(threads, ready):
        t.start()
        r.wait()  # (each at its blocking call before the block is timed: no pause)
    try:
        yield
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        q.put(None)
        for t in threads:
            t.join()


def _interleave(
    variants: Dict[str, Callable[[], float]], rounds: int, warmup: int
) -> Dict[str, List[float]]:
    """Each variant timed once a round, in an order drawn afresh each round (seeded): each
    in every place, and after every other, as often (see the module docstring)."""
    names = list(variants)
    for _ in range(warmup):
        for v in names:
            variants[v]()
    draw = random.Random(0)
    times: Dict[str, List[float]] = {v: [] for v in names}
    for _ in range(rounds):
        order = names[:]
        draw.shuffle(order)
        for v in order:
            times[v].append(variants[v]())
    return times


def _block(epoch: Callable[[], None]) -> float:
    """``--block`` epochs timed after ``SETTLE`` untimed ones (what the switch before, or
    the variant before, left cold or busy is not this one's)."""
    for _ in range(SETTLE):
        epoch()
    return lb._timed(epoch)


def idle(label: str, rounds: int, warmup: int) -> Dict[str, float]:
    """Each idle variant's median ratio to stock at the proxy."""
    ours = ("none drawn", "on demand")
    _, epochs, _ = lb.variant_models(label, VARIANTS, lambda v: v in ours)

    def under(variant: str, switch: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:  # (the switch outside the timed block)
            with switch():
                return _block(epochs[variant])

        return run

    variants = {
        "stock": lambda: _block(epochs["stock"]),
        "none drawn": under("none drawn", lambda: ic.configure(record_every=10**9)),
        "on demand": under("on demand", _on_demand),
        "threads": under("threads", _threads),
        "stock again": lambda: _block(epochs["stock again"]),
    }
    times = _interleave(variants, rounds, warmup)
    return {
        v: statistics.median(a / b for a, b in zip(times[v], times["stock"])) for v in VARIANTS[1:]
    }


def _iterations(epoch: Callable[[], None], n: int, kind: Callable[[], str], out: Dict) -> None:
    for _ in range(n):
        k = kind()  # what this iteration is, as it begins
        t0 = time.perf_counter_ns()
        epoch()
        out.setdefault(k, []).append((time.perf_counter_ns() - t0) / 1e3)


def captures(label: str, rounds: int, pause: int, size: int) -> Dict[str, Any]:
    """Iterations timed one by one: each kind's median over stock's, and how many of each."""
    _, epochs, _ = lb.variant_models(label, ("stock", "ours"), lambda v: v == "ours")
    times: Dict[str, List[float]] = {}
    demand = core.on_demand

    def on_demand_kind() -> str:
        c = demand.capture
        if switches.enabled:
            return "warm-up" if c is not None and c.state == "warming" else "captured"
        return "writing" if c is not None and c.handed else "idle"

    def drawn_kind() -> str:
        return "cycle drawn" if switches.enabled else "cycle not drawn"

    for _ in range(3):  # warm-up
        epochs["stock"]()
        epochs["ours"]()
    for r in range(rounds):
        _iterations(epochs["stock"], pause + size, lambda: "stock", times)
        with _on_demand():
            _iterations(epochs["ours"], pause, on_demand_kind, times)
            demand.ask(size, name=f"capture-{r}")
            _iterations(epochs["ours"], size + 2, on_demand_kind, times)
            while demand.capture is not None:  # (its folder being written)
                _iterations(epochs["ours"], 1, on_demand_kind, times)
        with ic.configure(record_every=pause):
            _iterations(epochs["ours"], pause + size, drawn_kind, times)
    stock = statistics.median(times["stock"])
    return {
        "stock_us": stock,
        "ratio": {k: statistics.median(times[k]) / stock for k in KINDS if times.get(k)},
        "n": {k: len(times.get(k, ())) for k in KINDS},
    }


def cora(rounds: int, warmup: int) -> Dict[str, float]:
    """The idle variants on the study's GCN at Cora's shape: median ratios to stock."""
    from instrumented_convs.commands.study.bench import training_epoch
    from instrumented_convs.commands.study.data import load_graph
    from instrumented_convs.commands.study.models import build_model

    data = load_graph("synthetic-cora")
    models = {}
    for v in VARIANTS:
        models[v], graph = build_model("pyg", data, stock=v not in ("none drawn", "on demand"))
        if v != VARIANTS[0]:
            models[v].load_state_dict(models[VARIANTS[0]].state_dict())
    epochs = {v: training_epoch(m, graph, data) for v, m in models.items()}
    timed = _block
    switches_of = {
        "none drawn": lambda: ic.configure(record_every=10**9),
        "on demand": _on_demand,
        "threads": _threads,
    }

    def run(v: str) -> Callable[[], float]:
        if v not in switches_of:
            return lambda: timed(epochs[v])

        def under() -> float:
            with switches_of[v]():
                return timed(epochs[v])

        return under

    times = _interleave({v: run(v) for v in VARIANTS}, rounds, warmup)
    return {
        v: statistics.median(a / b for a, b in zip(times[v], times["stock"])) for v in VARIANTS[1:]
    }


def one_process(label: str, rounds: int, warmup: int) -> Dict[str, Any]:
    """One process's measurement of one layer (with ``ONDEMAND_CORA=1``: the study's GCN)."""
    ondemand.listen(tempfile.mkdtemp(prefix="ondemand-cost-"))  # (for the whole process)
    if os.environ.get("ONDEMAND_CORA") == "1":
        return {"ratio": cora(rounds, warmup)}
    out = {"ratio": idle(label, rounds, warmup)}
    out.update(captures=captures(label, max(rounds // 10, 2), PAUSE, CAPTURE))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """Run the processes and print the tables (``--child``: one process's JSON)."""
    global PAUSE, CAPTURE
    argv = list(sys.argv[1:] if argv is None else argv)
    with_cora = "--cora" in argv
    argv = [a for a in argv if a != "--cora"]
    for flag in ("--pause", "--capture"):  # (processes.parse knows the common flags only)
        if flag in argv:
            i = argv.index(flag)
            value = int(argv.pop(i + 1))
            argv.pop(i)
            PAUSE, CAPTURE = (value, CAPTURE) if flag == "--pause" else (PAUSE, value)
            os.environ[f"ONDEMAND_{flag[2:].upper()}"] = str(value)
    PAUSE = int(os.environ.get("ONDEMAND_PAUSE", PAUSE))
    CAPTURE = int(os.environ.get("ONDEMAND_CAPTURE", CAPTURE))
    args = processes.parse(__doc__, LAYERS, argv)
    if args.child:
        return processes.child(args, one_process)
    layers = args.layers
    print(
        f"On demand, idle, at the launch-bound proxy (CPU, 1 thread): {args.processes} "
        f"processes a layer, each {args.rounds} interleaved rounds of {args.block} epochs; "
        "median over the processes of each variant's median ratio to stock [min-max]"
    )
    print(f"  {'layer':18s} " + " ".join(f"{v:>19s}" for v in VARIANTS[1:]))
    results: Dict[str, Any] = {}
    for label in layers:
        runs = processes.runs(__file__, label, args)
        if runs:
            results[label] = runs
            print(f"  {label:18s} " + " ".join(_cell(runs, "ratio", v) for v in VARIANTS[1:]))
    print(
        f"\nIterations timed one by one ({PAUSE} idle, a capture of {CAPTURE}, then the duty "
        f"cycle at one in {PAUSE}): each kind's median over stock's [min-max over processes]"
    )
    print(f"  {'layer':18s} {'stock us':>8s} " + " ".join(f"{k:>19s}" for k in KINDS))
    for label, runs in results.items():
        caps = [r["captures"] for r in runs]
        stock = statistics.median(c["stock_us"] for c in caps)
        cells = " ".join(_cell(caps, "ratio", k) for k in KINDS)
        print(f"  {label:18s} {stock:8.0f} {cells}")
    if with_cora:
        args.rounds, args.block = max(args.rounds // 4, 3), 1
        os.environ["ONDEMAND_CORA"] = "1"
        runs = processes.runs(__file__, "PyG GCNConv", args)
        del os.environ["ONDEMAND_CORA"]
        if runs:
            results["Cora"] = runs
            print(f"\nCora's shape (the study's GCN, PyG edge_index), {args.rounds} rounds:")
            print("  " + " ".join(f"{v}: {_cell(runs, 'ratio', v)}" for v in VARIANTS[1:]))
    processes.write(args.json, results)
    return 0


def _cell(runs: List[Dict[str, Any]], key: str, name: str) -> str:
    values = [r[key][name] for r in runs if name in r[key]]
    if not values:
        return f"{'-':>19s}"
    med = statistics.median(values)
    return f"{med:.3f} [{min(values):.3f}-{max(values):.3f}]"


if __name__ == "__main__":
    sys.exit(main())
