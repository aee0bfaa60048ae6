"""Mini-batch training under DistributedDataParallel, timed on every rank, merged into one table.

examples/minibatch.py (the study's 3-layer GCN on neighbour-sampled mini-batches of a
generated graph of ogbn-products' shape; every flag is the same) on several processes:
each rank trains on its own equal share of the training nodes (PyG: every N-th node, padded
so every rank runs the same number of batches; DGL: DataLoader(use_ddp=True)) and the model
is wrapped in DistributedDataParallel, so ``backward`` includes the gradient all-reduce.
After training every rank calls ``registry.summary(all_ranks=True)`` (a collective); rank 0
prints the merged table (counts and totals summed over ranks, with the slowest rank's total
and the spread, slowest over fastest, per step) and one line per rank.

On CPU the processes talk over gloo; with --device cuda over NCCL, one GPU per process
(``torch.cuda.set_device(LOCAL_RANK)``). Every rank generates the same graph (deterministic
given --seed), so memory grows with the number of processes: use --scale on small machines.
Start it with torchrun, which sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous address:

    torchrun --nproc-per-node 2 examples/ddp.py --scale 0.01
    torchrun --nproc-per-node 2 examples/ddp.py --platform dgl --scale 0.01 --json merged.json
    torchrun --nproc-per-node 4 examples/ddp.py --device cuda --batch-size 4096
    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/ddp.py --quick
"""

import argparse
import logging
import os
import sys
from typing import List, Optional

import torch
import torch.distributed as dist

from instrumented_convs import registry
from instrumented_convs.commands.study.data import MissingDependency
from instrumented_convs.commands.study.minibatch import describe
from instrumented_convs.commands.study.minibatch_cli import (
    add_minibatch_arguments,
    epoch_line,
    run_minibatch,
)
from instrumented_convs.report import Summary

PHASES = ("sample", "to_device", "forward", "backward")


def rank_line(rank: int, summary: Summary) -> str:
    """One rank's epoch total and the share of its main phases."""
    if "epoch" not in summary:
        return f"rank {rank}: no timed epoch"
    epoch = summary["epoch"]
    parts = [f"{p} {summary['epoch/' + p].total:.3f} s" for p in PHASES if f"epoch/{p}" in summary]
    return f"rank {rank}: epochs {epoch.total:.3f} s in all ({epoch.count} epochs): " + ", ".join(
        parts
    )


def main(argv: Optional[List[str]] = None) -> int:
    """Join the process group, train this rank's share, print the merged summary on rank 0."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_minibatch_arguments(parser)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        print(
            "examples/ddp.py runs under torchrun, which starts the processes and tells each "
            "its rank:\n"
            "    torchrun --nproc-per-node 2 examples/ddp.py --scale 0.01\n"
            "(one process without torchrun: examples/minibatch.py)",
            file=sys.stderr,
        )
        return 2
    cuda = torch.device(args.device).type == "cuda"
    if cuda:  # before the process group: NCCL and the merged summary use the current device
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        args.device = f"cuda:{local_rank}"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING, format=f"[rank {rank}] %(message)s"
    )
    try:
        s, result = run_minibatch(args)
    except (
        MissingDependency
    ) as exc:  # raised on every rank before any collective: all leave together
        if rank == 0:
            print(exc, file=sys.stderr)
        dist.destroy_process_group()
        return 2
    merged = registry.summary(all_ranks=True)  # a collective: every rank calls it
    if rank == 0:
        print(describe(s, result))
        print(epoch_line(merged.by_rank()[0], result) + " (rank 0)")
        print()
        print(merged.table(title="Mini-batch training"))
        for r, part in enumerate(merged.by_rank()):
            print(rank_line(r, part))
        if args.json:
            with open(args.json, "w") as fh:
                fh.write(merged.to_json())
    # Leave together: destroy_process_group() while another rank is still busy can hang at
    # exit (pytorch/pytorch#75097). After an error, no clean-up: torchrun stops the others.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
