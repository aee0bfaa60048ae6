"""The CUDA-event clock: lazy resolution checked with fake events on CPU, real ones on a GPU."""

from __future__ import annotations

import pytest
import torch

from instrumented_convs import registry
from instrumented_convs.commands.check import PASS
from instrumented_convs.commands.check import cuda as cuda_check
from instrumented_convs.core.clocks import events as clock
from instrumented_convs.core.clocks.events import EventPool, GpuSlot
from instrumented_convs.core.clocks.pending import PendingTimes
from instrumented_convs.layers import step
from instrumented_convs.testing import cuda_event_factory, depth

from .fakes import FakeEvent
from .helpers import gpu


def test_cuda_steps_record_event_pairs_and_resolve_only_at_summary(fake_cuda):
    with step("GCNConv", device="cuda"):
        FakeEvent.timeline += 2.0
        with step("lin"):  # inherits the CUDA clock from its parent
            FakeEvent.timeline += 0.5
    assert len(registry.pending) == 2
    assert len(fake_cuda) == 4
    assert not any(e.synchronized for e in fake_cuda)
    s = registry.summary()
    assert len(registry.pending) == 0
    assert s["GCNConv"].total == pytest.approx(2.5e-3)
    assert s["GCNConv/lin"].total == pytest.approx(0.5e-3)
    assert s["GCNConv"].self_time == pytest.approx(2.0e-3)


def test_a_cuda_frame_holds_its_event_and_slot_typed_and_lets_go_of_them_at_exit(fake_cuda):
    """A CUDA frame's start is its event (``frame.event``, from the pool of
    ``frame.event_device``) and its CPU start an int (``frame.start``); its place on the
    timeline's GPU track is a GpuSlot, filled in when its pair is read."""
    from instrumented_convs import configure
    from instrumented_convs.core.frames.stack import CPU, CUDA, thread_stack

    with configure(timeline=10):
        with step("outer", device="cuda:1"):
            frame = thread_stack()[-1]
            assert frame.mode == CUDA and frame.event is fake_cuda[-1]
            assert frame.event_device == 1 and type(frame.start) is int
            slot = frame.gpu
            assert type(slot) is GpuSlot and slot.ref is fake_cuda[0]
            assert slot.start_ms is None and slot.end_ms is None and slot.ref_ns <= frame.start
            FakeEvent.timeline += 1.5
            with step("inner", device="cpu"):
                inner = thread_stack()[-1]
                assert inner.mode == CPU and type(inner.start) is int and inner.event is None
        assert frame.event is None and frame.gpu is None  # reused frames keep no event
        registry.summary()  # reads the pair: the slot's times are set
        assert slot.end_ms - slot.start_ms == pytest.approx(1.5)
    # the start back to device 1's list; the first end is kept: the reference of its lags
    assert registry.pending.pool.available(1) == 1


def test_events_are_recycled_through_the_pool(fake_cuda):
    for _ in range(3):
        with step("x", device="cuda"):
            FakeEvent.timeline += 1
        registry.summary()
    assert len(fake_cuda) == 3  # one pair, reused; the first end kept as the lags' reference


def test_polling_folds_finished_pairs_without_blocking(fake_cuda):
    registry.pending.poll_at = 4
    try:
        for _ in range(3):
            with step("x", device="cuda"):
                FakeEvent.timeline += 1
        assert len(registry.pending) == 3
        for ev in fake_cuda[:4]:  # the first two pairs have finished on the device
            ev.done = True
        with step("x", device="cuda"):  # 4th pending pair: triggers a poll
            FakeEvent.timeline += 1
        assert len(registry.pending) == 2
        assert not any(e.synchronized for e in fake_cuda)
        assert sum(e.count for e in registry.entries()) == 4
    finally:
        registry.pending.poll_at = 2048


def test_hard_limit_waits_for_the_oldest_pair_only(fake_cuda):
    registry.pending.poll_at, registry.pending.hard_limit = 2, 3
    try:
        for _ in range(3):
            with step("x", device="cuda"):
                FakeEvent.timeline += 1
        # 3 pending, none finished: the oldest end event is waited on, one pair folded
        assert len(registry.pending) == 2
        synced = [e for e in fake_cuda if e.synchronized]
        assert synced == [fake_cuda[1]]
    finally:
        registry.pending.poll_at, registry.pending.hard_limit = 2048, 65536


def test_pending_queue_stays_bounded_when_the_gpu_never_catches_up(fake_cuda):
    registry.pending.poll_at, registry.pending.hard_limit = 64, 256
    try:
        for _ in range(5000):
            with step("x", device="cuda"):
                FakeEvent.timeline += 1
            assert len(registry.pending) < 256
        assert len(fake_cuda) < 2 * 256 + 4  # events are recycled, not created per step
        assert registry.summary()["x"].count == 5000
    finally:
        registry.pending.poll_at, registry.pending.hard_limit = 2048, 65536


def test_pending_queue_resolves_via_fold_callback():
    folded = []
    pool = EventPool(FakeEvent)
    q = PendingTimes(
        lambda entry, ns, sampled, host, lag: folded.append((entry, ns, sampled)), pool, poll_at=100
    )
    a, b = FakeEvent(), FakeEvent()
    FakeEvent.timeline = 0
    a.record()
    FakeEvent.timeline = 1.25
    b.record()
    q.add("e", a, b, 0, True)
    assert q.poll() == 0 and folded == []
    assert q.drain() == 1 and folded == [("e", 1_250_000, True)]
    assert pool.get(0) in (a, b) and pool.get(0) in (a, b)  # both recycled to device 0


def test_unreadable_pairs_count_as_untimed(fake_cuda, monkeypatch):
    def broken(self, end):
        raise RuntimeError("cudaErrorNotReady")

    monkeypatch.setattr(FakeEvent, "elapsed_time", broken)
    with step("odd", device="cuda"):
        pass
    r = registry.summary()["odd"]
    assert r.count == 0 and r.untimed == 1


def test_a_failing_event_record_neither_raises_nor_unbalances(fake_cuda, monkeypatch):
    calls = {"n": 0}
    real = FakeEvent.record

    def record(self, stream=None):
        calls["n"] += 1
        if calls["n"] == 2:  # the end event of the step: a device error surfacing here
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        real(self, stream)

    monkeypatch.setattr(FakeEvent, "record", record)
    with step("outer", device="cuda"):
        pass
    assert depth() == 0
    r = registry.summary()["outer"]
    assert r.untimed == 1 and r.count == 0


def test_events_are_recorded_on_the_steps_device_and_pooled_per_device(fake_cuda, monkeypatch):
    streams = []
    real = FakeEvent.record

    def record(self, stream=None):
        streams.append(stream)
        real(self, stream)

    monkeypatch.setattr(FakeEvent, "record", record)
    with step("on1", device="cuda:1"):
        with step("child"):  # inherits device 1
            pass
    with step("current", device="cuda"):
        pass
    # "cuda": the current device's current stream, named (event.record() would look it up
    # again, at 10 us a call on an H100's host)
    assert streams == ["stream-1", "stream-1", "stream-1", "stream-1", "stream-0", "stream-0"]
    registry.summary()
    pool = registry.pending.pool
    assert pool.available(1) == 3 and pool.available(0) == 1  # less each device's reference


def test_current_stream_is_read_at_every_call_and_its_object_reused(monkeypatch):
    """events.current_stream stands for torch.cuda.current_stream at a fraction of its cost:
    torch's reader of the current stream runs at every call (a stream switch is seen at
    once), and a stream object is made once per stream (torch makes one per call)."""
    now = {"data": (3, 0, 1)}
    reads, made = [], []

    def data(dev):
        reads.append(dev)
        return now["data"]

    def make(stream_id, device_index, device_type):
        made.append((stream_id, device_index, device_type))
        return f"stream {stream_id}"

    monkeypatch.setattr(clock, "_stream_data", data)
    monkeypatch.setattr(torch.cuda, "Stream", make)
    monkeypatch.setattr(clock, "_streams", {})
    monkeypatch.setattr(clock, "_streams_ready", True)
    assert [clock.current_stream(0) for _ in range(3)] == ["stream 3"] * 3
    now["data"] = (35, 0, 1)  # inside a `with torch.cuda.stream(s)`
    assert clock.current_stream(0) == "stream 35"
    now["data"] = (3, 0, 1)
    assert clock.current_stream(0) == "stream 3"
    assert reads == [0] * 5 and made == [(3, 0, 1), (35, 0, 1)]
    monkeypatch.setattr(clock, "_STREAMS_KEPT", 2)
    now["data"] = (99, 0, 1)  # a third stream: the cache is emptied, not grown
    assert clock.current_stream(0) == "stream 99" and len(clock._streams) == 1
    # torch.cuda.current_stream replaced (a test's fake): the replacement answers
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"fake {device}")
    assert clock.current_stream(0) == "fake 0"


@gpu
def test_current_stream_is_torchs_on_a_gpu():
    torch.cuda.current_stream(0)  # torch's lazy init has run
    assert clock.current_stream(0) == torch.cuda.current_stream(0)
    side = torch.cuda.Stream(0)
    with torch.cuda.stream(side):
        assert clock.current_stream(0) == side == torch.cuda.current_stream(0)
    assert clock.current_stream(0) == torch.cuda.current_stream(0) != side


def test_capture_is_not_timed_and_does_not_fail(fake_cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with step("captured", device="cuda"):
        pass
    s = registry.summary()
    assert s["captured"].count == 0 and s["captured"].untimed == 1
    assert fake_cuda == []
    assert "not timed" in str(s)


def test_cpu_device_uses_the_cpu_clock(fake_cuda):
    with step("on_cpu", device="cpu"):
        pass
    assert len(registry.pending) == 0 and fake_cuda == []
    assert registry.summary()["on_cpu"].count == 1


def test_exception_in_cuda_step_still_records_and_balances(fake_cuda):
    with pytest.raises(ValueError):
        with step("bad", device="cuda"):
            FakeEvent.timeline += 1
            raise ValueError
    assert depth() == 0
    s = registry.summary()
    assert s["bad"].errors == 1 and s["bad"].count == 1


@gpu
def test_real_cuda_events_time_a_kernel_without_synchronizing():
    # the check's own: python -m instrumented_convs check --device cuda runs it too
    status, detail, _ = cuda_check.events_without_sync(torch.device("cuda", 0))
    assert status == PASS, detail


@gpu
def test_cuda_graph_capture_skips_timing():
    status, detail, _ = cuda_check.graph_capture(torch.device("cuda", 0))
    assert status == PASS, detail


def test_cuda_event_factory_swaps_the_pool_and_empties_it_after():
    made = []
    with cuda_event_factory(lambda: made.append(FakeEvent()) or made[-1]) as pool:
        assert pool is registry.pending.pool  # the pool steps take events from
        assert pool.get(0) is made[0]
        pool.put(made[0], 0)
        assert pool.available(0) == 1
    assert pool.available(0) == 0  # no fake event outlives the block


@gpu
def test_cuda_backward_rows_nest_under_the_callers_region_without_synchronizing():
    """On CUDA autograd runs backward on its own device thread, where nothing is open: the
    backward rows must still nest under the caller's region, be timed by CUDA events (no
    synchronize), and leave every thread's stack balanced (the check's own function)."""
    status, detail, _ = cuda_check.backward_thread(torch.device("cuda", 0))
    assert status == PASS, detail
