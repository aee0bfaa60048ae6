"""Instructions, not seconds: what each variant adds to a layer call, counted by callgrind.

Timings on a shared 2-core VM move by a few percent from run to run (docs/performance.md),
more than many of the parts being changed. The number of instructions a variant executes
does not: this benchmark runs the launch-bound proxy of ``benchmarks/launch_bound.py`` (one
layer, 256 nodes, full training steps, one thread) under valgrind's callgrind and, for each
variant of ``benchmarks/backward_parts.py``, counts the instructions of ``--epochs`` epochs
(after 20 warm-up epochs: the first 16 calls of each layer are timed, the census), through
callgrind's client requests (zero the counters, run, dump them), with Python's cyclic garbage
collector run before and held off during each count (a collection costs millions of
instructions and would land in one variant's count by chance). Each variant is counted
``--passes`` times, the order reversed every other pass.

Counts still vary a little, always upwards (DGL's libxsmm kernels were generated again now
and then, ~2 million instructions each time, so DGL runs here with ``dgl.use_libxsmm(False)``,
stock and instrumented alike). So the figure is the *least* of the counts, and the most is
printed beside it. Printed per variant: thousands of instructions added per
layer call over stock (the least of stock's and the second stock copy's counts), the least
and the most, and the ratio of the epoch's instructions to stock's. Instructions are
not time (ours are interpreter instructions, torch's are dense kernels), but they compare two
versions of our machinery exactly: the same command before and after a change.

Needs ``valgrind`` and a C compiler with valgrind's ``callgrind.h``; each layer takes about two
minutes (valgrind runs ~50x slower; torch's import is not instrumented).

    python benchmarks/instructions.py                                 # PyG GCNConv, 10 epochs
    python benchmarks/instructions.py --layers "PyG SAGEConv" "DGL GraphConv"
    python benchmarks/instructions.py --quick                         # a smoke run (2 epochs)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

_HERE = os.path.dirname(os.path.abspath(__file__))
_CLIENT = r"""
#include <valgrind/callgrind.h>
void ic_zero(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void ic_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""
WARMUP = 20  # epochs before counting: past the census of every layer's first 16 calls


def missing() -> Optional[str]:
    """Why this benchmark cannot run here (None: it can)."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed"
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return "no C compiler (cc)"
    if not any(
        os.path.exists(os.path.join(d, "valgrind", "callgrind.h"))
        for d in ("/usr/include", "/usr/local/include")
    ):
        return "valgrind's callgrind.h is not installed"
    return None


def _client(tmp: str) -> str:
    """Build the tiny library that issues callgrind's client requests; its path."""
    src, lib = os.path.join(tmp, "client.c"), os.path.join(tmp, "libclient.so")
    with open(src, "w") as f:
        f.write(_CLIENT)
    subprocess.run(
        [os.environ.get("CC", "cc"), "-O1", "-shared", "-fPIC", "-o", lib, src], check=True
    )
    return lib


def child(label: str, epochs: int, passes: int, lib_path: str) -> None:
    """Inside valgrind: count each variant's epochs, ``passes`` times, the order reversed
    every other pass."""
    import torch

    sys.path.insert(0, _HERE)
    import backward_parts as bp
    import launch_bound as lb

    import instrumented_convs as ic

    torch.set_num_threads(1)
    if label.startswith("DGL"):
        import dgl

        dgl.use_libxsmm(
            False
        )  # its kernels are generated again now and then: ~2M instructions each time
    lib = ctypes.CDLL(lib_path)
    make_stock, make_ours, (graph, call) = lb.LAYERS[label]()
    torch.manual_seed(0)
    x, y = torch.randn(lb.NODES, lb.FEATURES), torch.randint(0, lb.CLASSES, (lb.NODES,))
    plan = [
        ("stock", make_stock, {}, False),
        ("backward off", make_ours, {"backward": False}, False),
        ("every call counted", make_ours, {"backward_every": 16}, True),
        ("node ranges only", make_ours, {"backward_every": 16}, "ranges"),
        ("every call timed", make_ours, {"backward_every": 1}, False),
        ("disabled", make_ours, {}, "disabled"),
        ("stock again", make_stock, {}, False),
    ]
    runs = []
    for name, make, settings, how in plan:
        epoch = lb._epoch(lb.Net(make, call), x, graph, y)

        def run(n: int, e=epoch, s=settings, c=how) -> None:
            if c == "disabled":
                with ic.configure(enabled=False):
                    for _ in range(n):
                        e()
                return
            bp._with(s, c, lambda: sum(e() or 0.0 for _ in range(n)))

        run(WARMUP)
        runs.append((name, run))
    order = [("warm-up", runs[0][1])]
    for k in range(passes):
        order += runs if k % 2 == 0 else runs[::-1]
    for name, run in order:
        gc.collect()  # no cyclic collection inside a count: it lands in one variant's by chance
        gc.disable()
        try:
            lib.ic_zero()
            run(epochs)
            lib.ic_dump(name.encode())
        finally:
            gc.enable()


def _read(prefix: str) -> Dict[str, List[int]]:
    """Instructions per dump, by variant name, in dump order."""
    out: Dict[str, List[int]] = {}
    for path in sorted(glob.glob(prefix + ".*"), key=lambda p: int(p.rsplit(".", 1)[1])):
        with open(path, errors="replace") as f:
            head = f.read(4000)
        name = re.search(r"^desc: Trigger: Client Request: (.*)$", head, re.M)
        total = re.search(r"^summary: (\d+)$", head, re.M)
        if name and total:
            out.setdefault(name.group(1), []).append(int(total.group(1)))
    out.pop("warm-up", None)
    return out


def measure(label: str, epochs: int, passes: int = 4) -> Tuple[Dict[str, List[int]], int]:
    """Run ``label`` under callgrind; (instructions per variant, one count a pass; stock's, the
    least of its counts and the second stock copy's)."""
    with tempfile.TemporaryDirectory() as tmp:
        lib = _client(tmp)
        prefix = os.path.join(tmp, "cg.out")
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={prefix}",
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            label,
            str(epochs),
            str(passes),
            lib,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"callgrind run of {label} failed:\n{proc.stderr[-3000:]}")
        counts = _read(prefix)
    stock = min(counts["stock"] + counts["stock again"])
    return counts, stock


def main(argv: Optional[List[str]] = None) -> int:
    """Print the instructions each variant adds, per layer."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], int(argv[2]), int(argv[3]), argv[4])
        return 0
    sys.path.insert(0, _HERE)
    import launch_bound as lb

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layers", nargs="+", default=["PyG GCNConv"], choices=list(lb.LAYERS))
    p.add_argument("--epochs", type=int, default=10, help="epochs counted per variant and order")
    p.add_argument(
        "--passes", type=int, default=4, help="counts of each variant (order reversed every other)"
    )
    p.add_argument("--quick", action="store_true", help="2 epochs, 2 passes: a smoke run")
    args = p.parse_args(argv)
    why = missing()
    if why is not None:
        print(f"instructions.py: cannot count instructions here: {why}")
        return 2
    epochs, passes = (2, 2) if args.quick else (args.epochs, args.passes)
    calls = epochs * 3  # the proxy's three layer calls per epoch
    print(
        f"Instructions added per layer call over stock, thousands: the least and the most of "
        f"{passes} counts "
        f"of {epochs} epochs each (callgrind); the epoch's ratio to stock, from the least"
    )
    for label in args.layers:
        counts, stock = measure(label, epochs, passes)
        print(f"{label}: stock {stock / epochs / 1e6:.2f} M instructions per epoch")
        for name, values in counts.items():
            lo, hi = min(values), max(values)
            print(
                f"  {name:20s} {(lo - stock) / calls / 1e3:8.1f} "
                f"{(hi - stock) / calls / 1e3:8.1f}   ratio {lo / stock:.4f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
