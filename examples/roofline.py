"""The roofline of the study's 3-layer GCN: FLOPs and bytes per step against the machine.

For each setup (PyG with ``edge_index``, PyG with a ``SparseTensor`` when torch-sparse is
installed, DGL): one warm-up epoch, ``--epochs`` epochs timed as the study times them (no
counters: they slow every op down), then one epoch counted (``configure(counters=True)``);
the counters' table then shows each step's FLOPs and bytes per call over the timed epochs'
calls and time, against this machine's limits (a short probe, cached: ``_probe.probe``).

    python examples/roofline.py                                 # synthetic-arxiv, 3 epochs
    python examples/roofline.py --dataset synthetic-cora --epochs 20
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("DGLBACKEND", "pytorch")

import torch  # noqa: E402

from instrumented_convs import configure, registry  # noqa: E402
from instrumented_convs._probe import probe  # noqa: E402
from instrumented_convs.study.data import SHAPES, MissingDependency, load_graph  # noqa: E402
from instrumented_convs.study.loop import train  # noqa: E402
from instrumented_convs.study.models import build_model  # noqa: E402

SETUPS = (("PyG, edge_index", "pyg", False), ("PyG, SparseTensor", "pyg", True),
          ("DGL", "dgl", False))  # fmt: skip


def main() -> int:
    """Print one roofline table per setup."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="synthetic-arxiv", choices=sorted(SHAPES))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--depth", type=int, default=4, help="rows down to this depth")
    args = p.parse_args()
    torch.manual_seed(0)
    data = load_graph(args.dataset)
    peak = probe()
    print(f"{args.dataset}: {data.num_nodes} nodes, {data.edge_index.size(1)} edges, "
          f"{data.x.size(1)} features; torch threads {torch.get_num_threads()}")  # fmt: skip
    for label, platform, sparse in SETUPS:
        try:
            model, graph = build_model(platform, data, hidden=args.hidden, sparse=sparse)
        except (MissingDependency, ImportError) as exc:
            print(f"\n{label}: skipped ({exc})")
            continue
        registry.reset()
        train(model, data, graph, epochs=args.epochs, warmup=1)
        timed = registry.summary().select(max_depth=args.depth)
        registry.reset()
        with configure(counters=True):
            train(model, data, graph, epochs=1, warmup=0)
        counted = registry.summary().select(max_depth=args.depth)
        registry.reset()
        print()
        print(counted.table(counters=True, peak=peak, times=timed).replace(
            "--- Counters", f"--- {label}: counters", 1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
