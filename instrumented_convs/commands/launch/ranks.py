"""A torchrun job's rank files (``rank<N>.json``, each rank's own save) merged into its
``run.json``: by rank 0 once every rank's last file is there or its wait is over; after
SIGTERM, within the grace period torchrun and the schedulers give (about 30 s before SIGKILL),
by another rank where rank 0 is held.

A rank held in a collective its peer left runs no Python until it is killed: its last
autosave (``ended_by`` ``running``) is merged in its place and named.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

from ...report import RUN_FILE
from .runs import SavedRun, merge_folder

__all__ = ["TERMINATED_MERGE_WAIT", "merged_run"]

logger = logging.getLogger(__name__)

#: How long rank 0 waits for the others' files after SIGTERM at most.
TERMINATED_MERGE_WAIT = 10.0


def merged_run(
    folder: Path, rank: Optional[int], wait: float, terminated: bool = False
) -> Optional[SavedRun]:
    """At a rank's end, its save written: rank 0 merges the ranks' files (waiting ``wait``
    seconds for theirs, :data:`TERMINATED_MERGE_WAIT` at most where ``terminated``) and
    returns the merged run; another rank returns None, after merging where rank 0 did not
    (``terminated`` only)."""
    if rank != 0:
        if terminated:
            _merge_for_rank_0(folder, rank)
        return None
    if terminated:
        wait = min(wait, TERMINATED_MERGE_WAIT)
    merged = merge_folder(folder, wait=wait)
    if merged["ranks_missing"]:
        logger.warning("run: no file from ranks %s: merged without them", merged["ranks_missing"])
    if merged["ranks_unfinished"]:
        logger.warning(
            "run: ranks %s saved no last file in %g s: merged from their autosaves",
            merged["ranks_unfinished"],
            wait,
        )
    return merged


def _merge_for_rank_0(folder: Path, rank: Optional[int]) -> None:
    """After SIGTERM, a rank but 0 that saved merges the files where rank 0 did not in a few
    seconds more than rank 0 waits: rank 0 may be held in a collective its peers left, where
    no Python runs until the SIGKILL that follows (its last autosave is merged)."""
    since = time.time()
    deadline = time.monotonic() + TERMINATED_MERGE_WAIT + 3
    merged = folder / RUN_FILE
    while time.monotonic() < deadline:
        if merged.exists() and merged.stat().st_mtime >= since - TERMINATED_MERGE_WAIT:
            return
        time.sleep(0.2)
    logger.warning("run: rank 0 merged nothing after SIGTERM (held?): rank %s merges", rank)
    merge_folder(folder)
