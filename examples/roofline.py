"""The roofline of the study's 3-layer GCN: FLOPs and bytes per step against the machine.

For each setup (PyG with ``edge_index``, PyG with a ``SparseTensor`` when torch-sparse is
installed, DGL): one warm-up epoch, ``--epochs`` epochs timed as the study times them (no
counters: they slow every op down), then one epoch counted (``configure(counters=True)``);
the counters' table then shows each step's FLOPs, bytes and allocated memory per call over
the timed epochs' calls and time, against this machine's limits (a short probe, cached:
``instrumented_convs.roofline.probe``; ``--peak-gbs``/``--peak-tflops`` in its place).
``--plot FILE`` draws every setup's steps on the roofline (matplotlib).

    python examples/roofline.py                                 # synthetic-arxiv, 3 epochs
    python examples/roofline.py --dataset synthetic-cora --epochs 20
    python examples/roofline.py --plot docs/roofline.png        # the picture in the docs
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("DGLBACKEND", "pytorch")

import torch  # noqa: E402

from instrumented_convs import configure, registry  # noqa: E402
from instrumented_convs.commands.study.data import (  # noqa: E402
    SHAPES,
    MissingDependency,
    load_graph,
)
from instrumented_convs.commands.study.loop import train  # noqa: E402
from instrumented_convs.commands.study.models import build_model  # noqa: E402
from instrumented_convs.roofline import given, plot, probe  # noqa: E402

SETUPS = (
    ("PyG, edge_index", "pyg", False),
    ("PyG, SparseTensor", "pyg", True),
    ("DGL", "dgl", False),
)


def main() -> int:
    """Print one roofline table per setup (and with ``--plot``, draw them all)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="synthetic-arxiv", choices=sorted(SHAPES))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--depth", type=int, default=4, help="rows down to this depth")
    p.add_argument("--peak-gbs", type=float, help="memory bandwidth, GB/s (default: probed)")
    p.add_argument("--peak-tflops", type=float, help="arithmetic peak, TFLOP/s (default: probed)")
    p.add_argument("--plot", metavar="FILE", help="draw the steps on the roofline (a PNG...)")
    args = p.parse_args()
    torch.manual_seed(0)
    data = load_graph(args.dataset)
    both = args.peak_gbs is not None and args.peak_tflops is not None
    peak = given(None if both else probe(), args.peak_gbs, args.peak_tflops)
    print(
        f"{args.dataset}: {data.num_nodes} nodes, {data.edge_index.size(1)} edges, "
        f"{data.x.size(1)} features; torch threads {torch.get_num_threads()}"
    )
    ax = None
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
        print(
            counted.table(counters=True, peak=peak, times=timed).replace(
                "--- Counters", f"--- {label}: counters", 1
            )
        )
        if args.plot:
            ax = plot(counted, peak, times=timed, label=label, ax=ax)
    if ax is not None:
        ax.set_title(
            f"{args.dataset}, 3-layer GCN, steps of an epoch on the roofline "
            f"({peak.gbs:.1f} GB/s, {peak.gflops:.1f} GFLOP/s)",
            fontsize=9,
        )
        ax.figure.savefig(args.plot, dpi=150, bbox_inches="tight")
        print(
            f"\nplot written to {args.plot} (left out, no FLOPs: "
            f"{', '.join(sorted(set(ax.ic_left_out))) or 'none'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
