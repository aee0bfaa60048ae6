"""One rank of the two-process tests of tests/test_distributed.py (started by torchrun).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/dist_worker.py OUT [gloo|nccl]

Rank r does a different amount of work: ``3 + r`` epochs of a step ``epoch`` with
``forward`` inside (times exact on a fake clock with gloo: rank r's ``forward`` takes
``(r + 1)`` µs, its ``epoch`` ``(r + 1)`` µs more), a step ``only_last`` that only the last
rank runs, and ``2 + r`` forward and backward passes of a real instrumented PyG GCNConv (DGL's
GraphConv where PyG is not installed).
Then every rank calls the merged summaries and writes what it got to ``OUT/rank<r>.json``;
the test process checks the numbers.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import instrumented_convs as ic
from instrumented_convs import region
from instrumented_convs.layers import step
from instrumented_convs.testing import FakeClock, cpu_clock


def main(out: str, backend: str) -> None:
    """Run this rank's share, merge, and write ``OUT/rank<r>.json``."""
    try:  # before the process group exists: the clear error
        ic.registry.summary(all_ranks=True)
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)

    with cpu_clock(FakeClock()) as clock:
        for _ in range(3 + rank):
            with region("epoch"):
                clock.advance((rank + 1) * 1000)
                with step("forward"):
                    clock.advance((rank + 1) * 1000)
        if rank == world - 1 and world > 1:
            with step("only_last"):
                clock.advance(7000)

    x = torch.randn(5, 4, device=device)
    src, dst = [0, 1, 2, 3, 4], [1, 2, 3, 4, 0]
    try:  # PyG where it is installed (the main and GPU environments), else DGL (newest DGL's)
        from instrumented_convs.pyg import GCNConv

        conv, layer, inner = GCNConv(4, 3).to(device), "GCNConv", "propagate/message"
        edge_index = torch.tensor([src, dst], device=device)
        call = lambda: conv(x, edge_index)  # noqa: E731
    except ImportError:
        import dgl

        from instrumented_convs.dgl import GraphConv

        conv, layer, inner = GraphConv(4, 3).to(device), "GraphConv", "update_all"
        graph = dgl.graph((src, dst)).to(device)
        call = lambda: conv(graph, x)  # noqa: E731
    ic.name_layers(torch.nn.ModuleDict({"conv": conv}))
    for _ in range(2 + rank):
        with region("layer", device=device):
            call().sum().backward()

    merged = ic.registry.summary(all_ranks=True)
    by_layer = ic.registry.summary(by="layer", all_ranks=True)
    mine = ic.registry.summary()
    # a group of the last rank alone: its members merge alone, others are refused
    last = dist.new_group([world - 1])
    if rank == world - 1:
        alone = ic.registry.summary(all_ranks=True, group=last).to_dict()
    else:
        try:
            ic.registry.summary(all_ranks=True, group=last)
            alone = "no error"
        except ValueError as exc:
            alone = str(exc)
    dist.barrier()
    result = dict(
        rank=rank,
        world=world,
        error=error,
        layer=layer,
        inner=inner,
        merged=merged.to_dict(),
        table=str(merged),
        plain_table=merged.table(spread=False),
        csv=merged.to_csv(),
        by_layer=by_layer.to_dict(),
        mine=mine.to_dict(),
        alone=alone,
    )
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "gloo")
