"""The C CUDA clock on a real GPU (``pytest -m gpu``): in use, on the right stream, as true as
torch's events, and its host time and lags in both regimes. Skipped without a GPU; the same
paths run on the CPU over a stand-in driver (tests/test_cuda_native.py)."""

from __future__ import annotations

import pytest
import torch

from instrumented_convs import registry
from instrumented_convs.commands.check import PASS
from instrumented_convs.commands.check import cuda as cuda_check
from instrumented_convs.core.clocks import events
from instrumented_convs.core.clocks.pending import LAG_FLOOR_NS
from instrumented_convs.core.native import speedups
from instrumented_convs.layers import step
from instrumented_convs.testing import depth

from .helpers import gpu

pytestmark = pytest.mark.skipif(speedups is None, reason="the C extension is not built")


@pytest.fixture
def cuda0():
    dev = torch.device("cuda", 0)
    torch.zeros(1, device=dev)  # CUDA up: the clock is chosen at the first CUDA step
    registry.reset()
    yield dev
    torch.cuda.synchronize(dev)
    registry.reset()
    assert depth() == 0


def _work(x: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        x = torch.tanh(x @ x)
    return x


@gpu
def test_the_c_clock_times_cuda_steps_on_a_gpu(cuda0):
    """The driver loads, CUDA steps queue their pairs in C, and the summary reads them."""
    x = torch.randn(512, 512, device=cuda0)
    with step("outer", device=cuda0):
        with step("inner"):
            _work(x, 4)
    assert events.native(), "the C clock is not in use on this GPU"
    assert speedups.cuda_pending() == 2  # queued in C, nothing synchronised
    s = registry.summary()
    assert s["outer"].count == 1 and s["outer/inner"].count == 1
    assert s["outer"].total >= s["outer/inner"].total > 0
    assert speedups.cuda_pending() == 0


@gpu
def test_the_c_clock_agrees_with_torchs_events(cuda0):
    """A step's time is its block's, as a pair of torch.cuda.Event around it reads it."""
    x = torch.randn(2048, 2048, device=cuda0)
    _work(x, 2)
    theirs = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        with step("block", device=cuda0):
            _work(x, 8)
        b.record()
        b.synchronize()
        theirs.append(a.elapsed_time(b) * 1e-3)
    ours = registry.summary()["block"].total
    assert ours == pytest.approx(sum(theirs), rel=0.05, abs=1e-4)


@gpu
def test_a_step_on_a_side_stream_times_that_stream(cuda0):
    """Events go on the current stream, read anew at each step: a side stream's kernels."""
    x = torch.randn(2048, 2048, device=cuda0)
    side = torch.cuda.Stream(cuda0)
    side.wait_stream(torch.cuda.current_stream(cuda0))
    with torch.cuda.stream(side):
        with step("side", device=cuda0):
            _work(x, 8)
    torch.cuda.current_stream(cuda0).wait_stream(side)
    r = registry.summary()["side"]
    assert r.count == 1 and r.total > 1e-4  # eight 2048² matmuls, not an empty interval


@gpu
def test_host_and_lag_in_both_regimes(cuda0):
    """Tiny steps keep the device caught up (launch-bound); big ones leave it behind."""
    small = torch.randn(8, 8, device=cuda0)
    for _ in range(50):
        with step("tiny", device=cuda0):
            small = torch.tanh(small)
    torch.cuda.synchronize(cuda0)
    big = torch.randn(4096, 4096, device=cuda0)
    for _ in range(10):
        with step("heavy", device=cuda0):
            _work(big, 4)
    s = registry.summary()
    tiny, heavy = s["tiny"], s["heavy"]
    assert tiny.device_calls == 50 and tiny.caught >= 40, (tiny.caught, tiny.lag)
    assert heavy.device_calls == 10 and heavy.caught <= 2, (heavy.caught, heavy.lag)
    assert heavy.lag / heavy.device_calls > LAG_FLOOR_NS * 1e-9
    assert heavy.host < heavy.total / 2  # issuing four matmuls is quicker than running them


@gpu
def test_capture_under_the_c_clock_is_untimed_and_replays(cuda0):
    """Steps inside a CUDA graph capture record nothing; the graph replays (the check's own
    test of a capture, with the C clock in use)."""
    with step("warm", device=cuda0):
        torch.ones(1, device=cuda0) * 2
    assert events.native()
    status, detail, _ = cuda_check.graph_capture(cuda0)
    assert status == PASS, detail


@gpu
def test_backward_on_the_device_thread_under_the_c_clock(cuda0):
    """Autograd's device thread records its events in the device's context (the check's
    own test of the backward thread, with the C clock in use)."""
    with step("warm", device=cuda0):
        torch.ones(1, device=cuda0) * 2
    assert events.native()
    status, detail, _ = cuda_check.backward_thread(cuda0)
    assert status == PASS, detail
