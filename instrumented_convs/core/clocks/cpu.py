"""The CPU clock of steps: ``perf_counter_ns``, replaceable for tests (the C fast path is
told of a new one)."""

from __future__ import annotations

import time
from typing import Callable

from ..native import speedups

#: The CPU clock, in integer nanoseconds. Replace it with :func:`set_cpu_clock` only (tests:
#: :mod:`instrumented_convs.testing`): Python steps read ``clock.cpu_now`` at each call, the
#: C fast path keeps the function :func:`set_cpu_clock` last told it of.
cpu_now: Callable[[], int] = time.perf_counter_ns


def set_cpu_clock(clock: Callable[[], int]) -> Callable[[], int]:
    """Replace the CPU clock (integer nanoseconds) and return the previous one."""
    global cpu_now
    previous, cpu_now = cpu_now, clock
    if speedups is not None:
        speedups.set_clock(clock)
    return previous
