"""What a DGL graph made anew costs a GraphConv call (the ``graph-formats`` rule, issue 66):
one call, forward and backward, given the graph made anew before it (its sparse formats made
inside the call), given one graph kept (formats made by its first call), and given one whose
formats were made at once (``create_formats_()``), interleaved, medians; and what reading
which formats a graph has made costs (``graph.formats()`` against DGL's one FFI call that
the rule's signal reads).

    python benchmarks/graph_formats.py
    python benchmarks/graph_formats.py --nodes 20000 --edges 200000 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Print the medians a call and the lookups' cost."""
    import dgl
    import torch
    from dgl import heterograph_index
    from dgl.nn import GraphConv

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=20000)
    p.add_argument("--edges", type=int, default=200000)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n = a.nodes
    src, dst = torch.randint(0, n, (2, a.edges))
    simple = dgl.to_simple(dgl.remove_self_loop(dgl.graph((src, dst), num_nodes=n)))
    x = torch.randn(n, a.width)
    conv = GraphConv(a.width, a.width)

    def call(g) -> float:
        t0 = time.perf_counter()
        conv(g, x).sum().backward()
        return time.perf_counter() - t0

    kept = dgl.add_self_loop(simple)
    made = dgl.add_self_loop(simple)
    made.create_formats_()
    call(kept), call(made)  # warm
    times = {"made anew": [], "kept": [], "formats made at once": []}
    for r in range(a.rounds):
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for name in order:
            g = {"made anew": None, "kept": kept, "formats made at once": made}[name]
            times[name].append(call(dgl.add_self_loop(simple) if g is None else g))
    print(f"GraphConv {a.width} wide, {kept.num_nodes()} nodes, {kept.num_edges()} edges, "
          f"forward and backward, medians of {a.rounds} interleaved:")  # fmt: skip
    for name, v in times.items():
        print(f"  given the graph {name}: {statistics.median(v) * 1e3:.2f} ms")
    small = dgl.graph((torch.randint(0, 100, (500,)), torch.randint(0, 100, (500,))))
    created = getattr(heterograph_index, "_CAPI_DGLHeteroGetCreatedFormats", None)
    k = 20000
    print(f"  graph.formats(): {timeit.timeit(small.formats, number=k) / k * 1e6:.1f} us")
    if created is not None:
        us = timeit.timeit(lambda: created(small._graph), number=k) / k * 1e6
        print(f"  DGL's created-formats lookup: {us:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
