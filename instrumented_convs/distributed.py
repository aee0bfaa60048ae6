"""Summaries merged over the processes of a torch.distributed job (``registry.summary(
all_ranks=True)``): a collective in which every rank sends its snapshot to every other in one
``all_gather_object`` and gets the same merged summary, each statistic merged as
:data:`~instrumented_convs.report.stats.STATISTICS` says. The process group is the user's
(NCCL: each rank calls ``torch.cuda.set_device`` first).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .core.storage.entry import EntryStats
from .report import Summary
from .report.stats import check_by, merge_ranks

__all__ = ["merged_summary"]

_NO_GROUP = (
    "summary(all_ranks=True) merges the registries of a torch.distributed job over its "
    "process group, and {why}. Call torch.distributed.init_process_group() first on every "
    "rank (torchrun sets the environment it reads: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), "
    "or call summary() without all_ranks for this process alone."
)


def _dist() -> Any:
    """``torch.distributed``, initialised, or a RuntimeError that says what to do."""
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(_NO_GROUP.format(why="this build of torch has no torch.distributed"))
    if not dist.is_initialized():
        raise RuntimeError(_NO_GROUP.format(why="no default process group is initialised"))
    return dist


def merged_summary(
    snapshot: Sequence[EntryStats],
    by: str = "step",
    unit: Optional[str] = None,
    group: Any = None,
    sampling: Optional[Dict[str, Any]] = None,
    compiled: Optional[Dict[str, Any]] = None,
) -> Summary:
    """The summary of every rank's ``snapshot``, merged (a collective over ``group``).

    Every rank of ``group`` (default: the default process group) must call it; every rank
    gets the same result. ``snapshot`` is this rank's ``registry.snapshot()``; ``sampling``
    its duty cycle's description (every rank draws the same iterations: rank 0's is kept);
    ``compiled`` what ran under ``torch.compile`` (rank 0's is kept).
    """
    check_by(by)  # before the collective: a bad argument costs no exchange
    dist = _dist()
    if dist.get_rank(group) < 0:
        raise ValueError("this process is not a member of the process group given to summary()")
    world = dist.get_world_size(group)
    mine = [tuple(entry) for entry in snapshot]  # plain tuples: nothing of ours is unpickled
    gathered: List[Any] = [None] * world
    dist.all_gather_object(gathered, (EntryStats._fields, mine, sampling, compiled), group=group)
    snapshots = []
    for rank, (fields, entries, *_) in enumerate(gathered):
        if tuple(fields) != EntryStats._fields:
            raise RuntimeError(
                f"rank {rank} runs another version of instrumented_convs (its statistics have the "
                f"fields {list(fields)}, ours {list(EntryStats._fields)}): install the same "
                f"version "
                "on every rank"
            )
        snapshots.append([EntryStats(*entry) for entry in entries])
    return merge_ranks(
        snapshots, by=by, unit=unit, sampling=gathered[0][2], compiled=gathered[0][3]
    )
