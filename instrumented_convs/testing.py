"""Helpers for tests (ours and yours): an exact fake clock, fake CUDA events, open steps.

This module is public so that tests of code that uses ``instrumented_convs`` can make its
timings exact, but it is for tests only: nothing here belongs in a training program.

.. code-block:: python

   from instrumented_convs import registry
   from instrumented_convs.layers import step
   from instrumented_convs.testing import FakeClock, cpu_clock

   with cpu_clock(FakeClock()) as clock:
       with step("x"):
           clock.advance(5)
   assert registry.summary()["x"].total == 5e-9
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, List, TypeVar

from .core.clocks import events
from .core.clocks.cpu import set_cpu_clock
from .core.frames import stack

__all__ = ["FakeClock", "cpu_clock", "set_cpu_clock", "cuda_event_factory", "open_steps", "depth"]

C = TypeVar("C", bound=Callable[[], int])


class FakeClock:
    """A CPU clock (integer nanoseconds) that moves only when told: timings become exact."""

    def __init__(self, start: int = 1_000_000) -> None:
        """A clock that reads ``start`` until :meth:`advance` moves it."""
        self.now = start

    def __call__(self) -> int:
        """The current time in nanoseconds."""
        return self.now

    def advance(self, ns: int) -> None:
        """Move the clock ``ns`` nanoseconds forward."""
        self.now += ns


@contextlib.contextmanager
def cpu_clock(clock: C) -> Iterator[C]:
    """Use ``clock`` (a callable returning integer ns) as the CPU clock inside the block."""
    previous = set_cpu_clock(clock)
    try:
        yield clock
    finally:
        set_cpu_clock(previous)


@contextlib.contextmanager
def cuda_event_factory(factory: Callable[[], Any]) -> Iterator[events.EventPool]:
    """Make the CUDA events of steps with ``factory()`` inside the block; yields the pool.

    A fake event needs ``record(stream=None)``, ``query()``, ``synchronize()`` and
    ``elapsed_time(end)`` (milliseconds), like ``torch.cuda.Event``. The process-wide pool
    is emptied on entry and on exit, so no fake event outlives the block.
    """
    previous = events.events.reset(factory)
    try:
        yield events.events
    finally:
        events.events.reset(previous)


def open_steps() -> List[str]:
    """The paths of the steps open on this thread, outermost first (``[]`` when none)."""
    return stack.open_steps()


def depth() -> int:
    """How many steps are open on this thread (a test should end with 0)."""
    return stack.depth()
