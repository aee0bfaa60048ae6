"""The duty cycle's budget (``configure(budget=B)``): the smallest K whose added time stays under
B, from the wall times of recent recorded and unrecorded iterations, agreed on by every rank
of a torch.distributed job. When to ask and how far K may move is :mod:`.cycle`'s. Imports
nothing from the package.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from typing import Deque

__all__ = ["Budget", "agree", "DECIDE_EVERY", "MAX_EVERY"]

logger = logging.getLogger(__name__)

#: The fewest iterations between two choices of K.
DECIDE_EVERY = 64
#: The most iterations a budget records one of.
MAX_EVERY = 10_000


def _median(values: Deque[int]) -> float:
    return float(statistics.median(values))


class Budget:
    """Chooses K to keep the added time under a budget: the smallest K whose added time,
    (recorded / unrecorded - 1) / K, stays under the budget less the cycle's own hooks'
    share (medians of the last iterations)."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.recorded: Deque[int] = deque(maxlen=16)  # ns of recent recorded iterations
        self.unrecorded: Deque[int] = deque(maxlen=64)  # ns of recent unrecorded ones
        self.own: Deque[int] = deque(maxlen=64)  # ns the cycle's hooks took of each
        self.decided_at = 0  # the iteration of the last choice
        self.every = 0  # the rate it had chosen when the cycle stopped (0: none yet)
        self.why = "no measurement yet: one iteration in 10 to start with"

    def add(self, recorded: bool, ns: int) -> None:
        (self.recorded if recorded else self.unrecorded).append(ns)

    def ready(self, i: int) -> bool:
        """Whether iteration ``i`` may choose K (the same answer on every rank)."""
        return (
            len(self.recorded) >= 5
            and len(self.unrecorded) >= 16
            and (not self.decided_at or i - self.decided_at >= DECIDE_EVERY)
        )

    def propose(self) -> int:
        """The smallest K whose added time stays under the budget, less what the cycle's
        own hooks take of an iteration; :attr:`why` says so."""
        r, u = _median(self.recorded), _median(self.unrecorded)
        own = _median(self.own) / u if self.own and u > 0 else 0.0
        added = r / u - 1.0 if u > 0 else 0.0
        room = self.budget - own
        if added <= 0:
            every = 1
        else:
            every = min(MAX_EVERY, max(1, math.ceil(added / max(room, 1e-6) - 1e-9)))
        self.why = (
            f"a recorded iteration took {r / 1e3:.0f} us against {u / 1e3:.0f} us unrecorded "
            f"(+{100 * added:.1f}%, medians of the last {len(self.recorded)} and "
            f"{len(self.unrecorded)}), the cycle's own hooks {100 * own:.2f}% of one: one in "
            f"{every} keeps the added time under {100 * self.budget:g}%"
        )
        return every


def agree(every: int) -> int:
    """The largest ``every`` of the ranks of a torch.distributed job (``every`` outside one)."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return every
        import torch

        device = "cpu"
        if dist.get_backend() == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        t = torch.tensor([every], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())
    except Exception:  # noqa: BLE001 - a job without a usable group: decide alone
        logger.exception("instrumented_convs: the ranks could not agree on a rate")
        return every
