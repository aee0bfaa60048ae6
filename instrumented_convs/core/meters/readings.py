"""The registry's snapshot and reset with the meters' figures added: the registry is storage
only, and this is where it meets the counters and memory per step."""

from __future__ import annotations

from typing import List

from ..storage.entry import EntryStats
from ..storage.registry import registry
from . import counters, memory, signals


def snapshot() -> List[EntryStats]:
    """Every entry as plain data (``registry.snapshot()``), with what the counters and memory
    charged to it."""
    return registry.snapshot(readers=(counters.of, memory.of))


def reset() -> None:
    """Forget every recorded time, the timeline, the meters' figures and the advice's signals."""
    registry.reset()
    counters.clear()
    memory.clear()
    signals.clear()
