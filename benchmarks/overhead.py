"""What instrumentation costs a training epoch: stock layers vs instrumented, side by side.

Four copies of the study's 3-layer GCN with the same weights (stock, instrumented enabled,
instrumented disabled, and a second stock copy whose ratio to the first is the A/A noise
floor), one training epoch of each timed in turn, for ogbn-arxiv's and Cora's shapes and each
input kind. The method (interleaving, medians, ratios) is described in
instrumented_convs.commands.study.bench, which holds the measuring code (``python -m
instrumented_convs bench`` runs it too, on Cora's shape by default).

    python benchmarks/overhead.py                         # CPU, arxiv and Cora shapes
    python benchmarks/overhead.py --device cuda --json out.json
    python benchmarks/overhead.py --quick                 # a smoke run
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from instrumented_convs.commands.study.bench import add_bench_arguments, run_bench


def main(argv: Optional[List[str]] = None) -> int:
    """Run the cases, print the table, optionally write JSON."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_bench_arguments(p, default_shapes=("synthetic-arxiv", "synthetic-cora"))
    run_bench(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
