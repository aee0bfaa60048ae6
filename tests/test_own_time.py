"""The tool's own time (instrumented_convs.core.frames.stack.Frame.own): what a step's enter and
exit,
and a backward step's hooks, spend between their clock readings is left out of the steps
around them; regions keep the time as it passed. A clock that moves by a fixed amount at
every reading stands for the tool's cost, ``advance`` for the work."""

from __future__ import annotations

import pytest
import torch

from instrumented_convs import configure, region, registry
from instrumented_convs.layers import mark_outputs, step
from instrumented_convs.testing import cpu_clock

from .helpers import READ, Ticking

WORK, CHILD_WORK, CHILDREN = 100_000, 10_000, 4


def _rows():
    return {(r.name, r.phase): r for r in registry.summary().rows}


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


@pytest.fixture(params=["none", True], ids=["fast path", "general path"])
def path(request):
    """No NVTX backend (the common case, the fast path), or one (every step takes the
    general path)."""
    configure(nvtx=request.param, backward_every=1)


def _layer(clock: Ticking, x: torch.Tensor) -> torch.Tensor:
    with step("p"):
        clock.advance(WORK)
        y = x
        for _ in range(CHILDREN):
            with step("c"):
                clock.advance(CHILD_WORK)
                y = y * 2
        return mark_outputs(y)


def test_a_step_leaves_out_its_childrens_enters_and_exits_a_region_does_not(path):
    with cpu_clock(Ticking()) as clock:
        with region("r"):
            _layer(clock, torch.ones(3, requires_grad=True))
    rows = _rows()
    r, p, c = rows["r", "forward"], rows["r/p", "forward"], rows["r/p/c", "forward"]
    assert _ns(c.total) == CHILDREN * (CHILD_WORK + READ)  # its work, and the reading ending it
    # what is left of each child's enter and exit in the parent: at most one reading
    # (four would be there if their own time stayed: two readings each way)
    assert WORK <= _ns(p.self_time) <= WORK + (CHILDREN + 2) * READ
    # the region keeps the time as it passed: every reading of the steps inside it
    assert _ns(r.total) >= _ns(p.total) + CHILDREN * 3 * READ


def test_a_backward_step_leaves_out_the_hooks_of_the_steps_inside_it(path):
    x = torch.ones(3, requires_grad=True)
    with cpu_clock(Ticking()) as clock:
        y = _layer(clock, x)
        with region("backward"):
            y.sum().backward()
    rows = _rows()
    p, c = rows["backward/p", "backward"], rows["backward/p/c", "backward"]
    assert c.count == CHILDREN and _ns(c.total) == CHILDREN * READ  # the reading ending it
    # each child's two hooks read the clock four times; at most one is left in p
    assert _ns(p.self_time) <= (CHILDREN + 2) * READ
    assert _ns(rows["backward", "forward"].total) >= _ns(p.total) + CHILDREN * 3 * READ
    assert torch.equal(x.grad, torch.full((3,), 2.0**CHILDREN))
