"""The C CUDA clock (core/native/_speedups_cuda.c) on the CPU, over a stand-in driver
(tests/native/fake_cuda.c), checked against its Python twin (fake torch events) run on the
same scripted device: the registry's statistics must agree."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import torch

from instrumented_convs import configure, registry
from instrumented_convs.core.clocks import events
from instrumented_convs.core.clocks.cpu import set_cpu_clock
from instrumented_convs.core.clocks.pending import LAG_BUCKET_NS, LAG_BUCKETS, LAG_FLOOR_NS
from instrumented_convs.core.frames.stack import thread_stack
from instrumented_convs.core.native import speedups
from instrumented_convs.core.steps.step import Step
from instrumented_convs.layers import step
from instrumented_convs.testing import FakeClock, cuda_event_factory, depth

pytestmark = pytest.mark.skipif(speedups is None, reason="the C extension is not in use")

SOURCE = Path(__file__).parent / "native" / "fake_cuda.c"
ERR_RECORD = 700  # CUDA_ERROR_ILLEGAL_ADDRESS: a device error surfacing at a record
US, MS = 1_000, 1_000_000
#: EntryStats fields the two clocks must agree on.
FIELDS = ("count", "total", "sumsq", "min", "max", "errors", "untimed")
FIELDS += ("host", "dcalls", "lag", "caught")

_SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    "fake_reset": (None, []),
    "fake_set_host_ns": (None, [ctypes.c_longlong]),
    "fake_host_ns": (ctypes.c_longlong, []),
    "fake_set_record_cost_ns": (None, [ctypes.c_longlong]),
    "fake_set_latency_ns": (None, [ctypes.c_int, ctypes.c_longlong]),
    "fake_launch": (None, [ctypes.c_int, ctypes.c_longlong]),
    "fake_tail_ns": (ctypes.c_longlong, [ctypes.c_int]),
    "fake_progress": (None, [ctypes.c_int, ctypes.c_longlong]),
    "fake_complete_all": (None, []),
    "fake_complete": (None, [ctypes.c_void_p]),
    "fake_set_capturing": (None, [ctypes.c_int]),
    "fake_capture_broken": (ctypes.c_int, []),
    "fake_fail_next": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
    "fake_fail_after": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]),
    "fake_calls": (ctypes.c_longlong, [ctypes.c_char_p]),
    "fake_live_events": (ctypes.c_longlong, []),
    "fake_records": (ctypes.c_longlong, []),
    "fake_misuse": (ctypes.c_longlong, []),
    "fake_last_synced": (ctypes.c_longlong, []),
    "fake_last_stream": (ctypes.c_void_p, []),
    "fake_event_device": (ctypes.c_int, [ctypes.c_void_p]),
    "fake_event_time_ns": (ctypes.c_longlong, [ctypes.c_void_p]),
    "fake_event_seq": (ctypes.c_longlong, [ctypes.c_void_p]),
    "fake_event_done": (ctypes.c_int, [ctypes.c_void_p]),
    "fake_stream": (ctypes.c_void_p, [ctypes.c_int]),
    "fake_set_current": (None, [ctypes.c_int]),
    "fake_current_device": (ctypes.c_int, []),
    "fake_ctx_depth": (ctypes.c_int, []),
    "fake_retained": (ctypes.c_int, [ctypes.c_int]),
}


def _compile(out: Path, *defines: str) -> Path:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in CUDA driver")
    cmd = [cc, "-shared", "-fPIC", "-O1", *defines, "-o", str(out), str(SOURCE)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def fake_driver(tmp_path_factory) -> Tuple[Path, Any]:
    """The stand-in driver, built once: its path and the library, its fake_* typed."""
    path = _compile(tmp_path_factory.mktemp("fake_cuda") / "libfake_cuda.so")
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return path, lib


class HostClock(FakeClock):
    """The fake CPU clock: the host time of the fake device's model (a record moves it)."""

    def __init__(self, get: Callable[[], int], put: Callable[[int], None]) -> None:
        self._get, self._put = get, put
        super().__init__()

    @property  # type: ignore[override]
    def now(self) -> int:
        return self._get()

    @now.setter
    def now(self, t: int) -> None:
        self._put(t)


# -- the twin's fake device: the same model as fake_cuda.c, in Python ---------------------


class TwinStream:
    def __init__(self, device: int) -> None:
        self.device = device


class TwinDevice:
    """fake_cuda.c's device model for the twin's fake ``torch.cuda.Event``s."""

    def __init__(self) -> None:
        self.now = 0
        self.latency: Dict[int, int] = {}
        self.tail: Dict[int, int] = {}
        self.capturing = False
        self.broken = False
        self.fail: Dict[str, List[int]] = {}  # call -> [calls to let pass, error]
        self.calls: Counter = Counter()
        self.records = 0
        self.record_cost = 0
        self.last_synced = 0
        self.made: List["TwinEvent"] = []

    def enter(self, name: str) -> None:
        self.calls[name] += 1
        fail = self.fail.get(name)
        if fail is not None:
            if fail[0] == 0:
                del self.fail[name]
                raise RuntimeError(f"CUDA error: fake error {fail[1]}")
            fail[0] -= 1

    def launch(self, dev: int, ns: int) -> None:
        start = max(self.now + self.latency.get(dev, 0), self.tail.get(dev, 0))
        self.tail[dev] = start + ns

    def progress(self, dev: int, t: int) -> None:
        for e in self.made:
            if e.dev == dev and e.t is not None and e.t <= t:
                e.done = True


class TwinEvent:
    """A fake ``torch.cuda.Event`` on :class:`TwinDevice` (float ms, as torch gives)."""

    def __init__(self, model: TwinDevice) -> None:
        self.model = model
        self.dev: Optional[int] = None
        self.t: Optional[int] = None
        self.done = True
        self.seq = 0
        model.calls["cuEventCreate"] += 1
        model.made.append(self)

    def record(self, stream: TwinStream) -> None:
        m = self.model
        m.enter("cuEventRecord")
        if m.capturing:  # a timing event on a capturing stream: the capture is invalidated
            m.broken = True
            raise RuntimeError("operation not permitted when stream is capturing")
        if self.dev is None:
            self.dev = stream.device
        elif self.dev != stream.device:
            raise RuntimeError("invalid resource handle")
        t = max(m.now + m.latency.get(self.dev, 0), m.tail.get(self.dev, 0))
        m.tail[self.dev] = t
        m.records += 1
        self.t, self.done, self.seq = t, False, m.records
        m.now += m.record_cost

    def query(self) -> bool:
        self.model.enter("cuEventQuery")
        return self.done

    def synchronize(self) -> None:
        self.model.enter("cuEventSynchronize")
        if self.t is not None:  # the device got there: the events before it are done too
            self.model.progress(self.dev, self.t)
        self.done = True
        self.model.last_synced = self.seq

    def elapsed_time(self, end: "TwinEvent") -> float:
        self.model.enter("cuEventElapsedTime")
        if self.t is None or end.t is None or self.dev != end.dev:
            raise RuntimeError("invalid resource handle")
        if not (self.done and end.done):
            raise RuntimeError("device not ready")
        return ctypes.c_float((end.t - self.t) / 1e6).value


# -- the two backends, one interface ------------------------------------------------------

_COUNTED = ("cuEventCreate", "cuEventRecord", "cuEventQuery", "cuEventSynchronize")
_COUNTED += ("cuEventElapsedTime",)


class Backend:
    """What a scenario drives: the CPU clock, the current device, the fake device."""

    name = ""
    clock: HostClock

    def __init__(self) -> None:
        self.device = 0
        self.enters = 0  # Step._enter calls (the Python path of a step)

    def set_device(self, dev: int) -> None:
        self.device = dev


class Native(Backend):
    """The C clock over fake_cuda.c."""

    name = "C"

    def __init__(self, lib: Any) -> None:
        super().__init__()
        self.lib = lib
        self.streams = {0: 0, 1: lib.fake_stream(1)}  # device 0: the default stream
        self.clock = HostClock(lib.fake_host_ns, lib.fake_set_host_ns)

    def raw_stream(self, dev: int) -> int:
        return self.streams.get(dev, 0)

    def set_device(self, dev: int) -> None:
        super().set_device(dev)
        self.lib.fake_set_current(dev)  # torch's set_device: its context current

    def launch(self, dev: int, ns: int) -> None:
        self.lib.fake_launch(dev, ns)

    def set_latency(self, dev: int, ns: int) -> None:
        self.lib.fake_set_latency_ns(dev, ns)

    def set_record_cost(self, ns: int) -> None:
        self.lib.fake_set_record_cost_ns(ns)

    def progress(self, dev: int, t: int) -> None:
        self.lib.fake_progress(dev, t)

    def tail(self, dev: int) -> int:
        return self.lib.fake_tail_ns(dev)

    def capture(self, on: bool) -> None:
        self.lib.fake_set_capturing(int(on))

    def fail(self, fn: str, after: int = 0) -> None:
        assert self.lib.fake_fail_after(fn.encode(), after, ERR_RECORD) == 0

    def counts(self) -> Dict[str, int]:
        return {fn: self.lib.fake_calls(fn.encode()) for fn in _COUNTED}

    def last_synced(self) -> int:
        return self.lib.fake_last_synced()

    def broken(self) -> bool:
        return bool(self.lib.fake_capture_broken())


class Twin(Backend):
    """The Python twin: fake torch events on :class:`TwinDevice`."""

    name = "twin"

    def __init__(self) -> None:
        super().__init__()
        self.model = TwinDevice()

        def move(t: int) -> None:
            self.model.now = t

        self.clock = HostClock(lambda: self.model.now, move)

    def launch(self, dev: int, ns: int) -> None:
        self.model.launch(dev, ns)

    def set_latency(self, dev: int, ns: int) -> None:
        self.model.latency[dev] = ns

    def set_record_cost(self, ns: int) -> None:
        self.model.record_cost = ns

    def progress(self, dev: int, t: int) -> None:
        self.model.progress(dev, t)

    def tail(self, dev: int) -> int:
        return self.model.tail.get(dev, 0)

    def capture(self, on: bool) -> None:
        self.model.capturing = on

    def fail(self, fn: str, after: int = 0) -> None:
        self.model.fail[fn] = [after, ERR_RECORD]

    def counts(self) -> Dict[str, int]:
        return {fn: self.model.calls[fn] for fn in _COUNTED}

    def last_synced(self) -> int:
        return self.model.last_synced

    def broken(self) -> bool:
        return self.model.broken


def _count_enters(mp: pytest.MonkeyPatch, b: Backend) -> None:
    real = Step._enter

    def counted(self: Step, stack: list, top: Any) -> Step:
        b.enters += 1
        return real(self, stack, top)

    mp.setattr(Step, "_enter", counted)


def _no_sync(*a: Any, **k: Any) -> None:
    raise AssertionError("torch.cuda.synchronize() called")


def _no_event(*a: Any, **k: Any) -> None:
    raise AssertionError("the C clock made a torch.cuda.Event")


@contextlib.contextmanager
def native_clock(fake_driver: Tuple[Path, Any]) -> Iterator[Native]:
    """The C clock over a fresh fake driver; everything restored after."""
    path, lib = fake_driver
    lib.fake_reset()
    assert speedups.cuda_load(str(path)) is None
    b = Native(lib)
    b.set_device(0)
    previous = set_cpu_clock(b.clock)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.cuda, "Event", _no_event)
            mp.setattr(torch.cuda, "synchronize", _no_sync)
            _count_enters(mp, b)
            events.use_driver(lambda: b.device, b.raw_stream)
            try:
                yield b
            finally:
                events.use_twin()
    finally:
        set_cpu_clock(previous)
        registry.reset()
        lib.fake_set_current(-1)
    assert speedups.cuda_pending() == 0
    assert lib.fake_misuse() == 0, "a destroyed event was used"
    assert depth() == 0


@contextlib.contextmanager
def twin_clock() -> Iterator[Twin]:
    """The Python twin over :class:`TwinDevice`; everything restored after."""
    b = Twin()
    previous = set_cpu_clock(b.clock)
    try:
        with pytest.MonkeyPatch.context() as mp, cuda_event_factory(lambda: TwinEvent(b.model)):
            mp.setattr(torch.cuda, "is_current_stream_capturing", lambda: b.model.capturing)
            mp.setattr(torch.cuda, "current_device", lambda: b.device)
            mp.setattr(
                torch.cuda,
                "current_stream",
                lambda device=None: TwinStream(b.device if device is None else device),
            )
            mp.setattr(torch.cuda, "synchronize", _no_sync)
            _count_enters(mp, b)
            assert not events.native()
            yield b
    finally:
        set_cpu_clock(previous)
        registry.reset()
    assert depth() == 0


def _stats() -> Dict[str, Tuple[int, ...]]:
    return {s.path: tuple(getattr(s, f) for f in FIELDS) for s in registry.snapshot()}


Scenario = Callable[[Backend], Any]


def agree(
    fake_driver: Tuple[Path, Any], scenario: Scenario, calls: Tuple[str, ...] = _COUNTED
) -> Dict[str, Any]:
    """Run ``scenario`` on the C clock, then on the twin; both must see the same statistics,
    observations and ``calls`` of the driver. Returns the C run's (``stats``, ``obs``,
    ``calls``, ``enters``)."""
    runs = {}
    for make in (lambda: native_clock(fake_driver), twin_clock):
        with make() as b:
            obs = scenario(b)
            stats = _stats()
            runs[b.name] = {"stats": stats, "obs": obs, "calls": b.counts(), "enters": b.enters}
    c, twin = runs["C"], runs["twin"]
    assert c["stats"] == twin["stats"]
    assert c["obs"] == twin["obs"]
    assert {k: c["calls"][k] for k in calls} == {k: twin["calls"][k] for k in calls}
    return c


def row(result: Dict[str, Any], path: str) -> Dict[str, int]:
    return dict(zip(FIELDS, result["stats"][path]))


# -- scenarios ----------------------------------------------------------------------------

ROUNDS = 5


def launch_bound(b: Backend) -> None:
    """The device keeps up: each event runs 3 us after its record."""
    b.set_latency(0, 3 * US)
    for _ in range(ROUNDS):
        with step("conv", device="cuda"):
            b.launch(0, 20 * US)  # shorter than the host's work: done before the next record
            b.clock.advance(40 * US)
            with step("lin"):  # inherits the device
                b.launch(0, 5 * US)
                b.clock.advance(10 * US)
            with step("act", device="cpu"):
                b.clock.advance(5 * US)
        with step("loss", device="cpu"):
            b.clock.advance(7 * US)
            with step("reduce", device="cuda"):
                b.clock.advance(2 * US)
        b.clock.advance(100 * US)


def test_launch_bound_steps_agree_and_are_caught_up(fake_driver):
    """Device keeps up: lag 0, caught == dcalls, host == CPU time."""
    r = agree(fake_driver, launch_bound)
    conv, lin, act = row(r, "conv"), row(r, "conv/lin"), row(r, "conv/act")
    reduce = row(r, "loss/reduce")
    assert conv["count"] == conv["dcalls"] == conv["caught"] == ROUNDS
    assert conv["host"] == ROUNDS * 55 * US and conv["total"] == ROUNDS * 55 * US
    assert lin["host"] == lin["total"] == ROUNDS * 10 * US and lin["caught"] == ROUNDS
    assert reduce["host"] == reduce["total"] == ROUNDS * 2 * US and reduce["caught"] == ROUNDS
    assert conv["lag"] == lin["lag"] == reduce["lag"] == 0
    assert act["count"] == ROUNDS and act["dcalls"] == 0 and act["total"] == ROUNDS * 5 * US
    assert row(r, "loss")["dcalls"] == 0 and row(r, "loss")["total"] == ROUNDS * 9 * US
    # CUDA steps went through C after their path's first call: Step._enter ran once per path
    assert r["enters"] == 5
    assert r["calls"]["cuEventRecord"] == 3 * 2 * ROUNDS


def costly_records(b: Backend) -> None:
    """launch_bound, each record keeping the host 2 us: the tool's own time."""
    b.set_record_cost(2 * US)
    launch_bound(b)


def test_the_host_time_leaves_the_records_out(fake_driver):
    """Records cost host time: host leaves them out, the device span has them."""
    r = agree(fake_driver, costly_records)
    conv, lin = row(r, "conv"), row(r, "conv/lin")
    assert conv["host"] == ROUNDS * 55 * US and lin["host"] == ROUNDS * 10 * US
    # from the start record: its cost, the body, and the children's two records
    assert conv["total"] == ROUNDS * (2 + 55 + 4) * US and lin["total"] == ROUNDS * 12 * US
    assert conv["lag"] == lin["lag"] == 0 and conv["caught"] == ROUNDS


def device_bound(b: Backend) -> None:
    """An idle device first (the lag's zero), then 5 ms of work queued ahead of every step."""
    b.set_latency(0, 3 * US)
    with step("warmup", device="cuda"):
        b.clock.advance(10 * US)
    b.launch(0, 5 * MS)
    for _ in range(ROUNDS):
        with step("conv", device="cuda"):
            b.launch(0, 30 * US)  # as long as the host's work: the backlog stays 5 ms
            b.clock.advance(30 * US)


def test_device_bound_steps_agree_and_lag_by_the_backlog(fake_driver):
    """Device 5 ms behind: lag == 5 ms per call, caught == 0."""
    r = agree(fake_driver, device_bound)
    conv, warm = row(r, "conv"), row(r, "warmup")
    assert conv["dcalls"] == ROUNDS and conv["caught"] == 0
    assert conv["lag"] == ROUNDS * 5 * MS
    assert conv["host"] == conv["total"] == ROUNDS * 30 * US
    assert warm["lag"] == 0 and warm["caught"] == 1


def falling_behind(b: Backend) -> List[int]:
    """Kernels longer than the host's work: the device falls further behind each step."""
    tails = []
    for i in range(8):
        with step("conv", device="cuda"):
            b.launch(0, (300 + 17 * i) * US)
            b.clock.advance(90 * US)
            with step("lin"):
                b.launch(0, 40 * US)
                b.clock.advance(11 * US)
            b.clock.advance(5 * US)  # conv ends 5 us after lin on the host, with it on the device
        b.clock.advance(13 * US)
        tails.append(b.tail(0))
    return tails


def test_a_device_falling_behind_agrees(fake_driver):
    """Growing backlog: lags grow, C and twin agree exactly."""
    r = agree(fake_driver, falling_behind)
    conv, lin = row(r, "conv"), row(r, "conv/lin")
    # the first lin and conv each the least so far; then conv's first end is the zero
    assert conv["caught"] == lin["caught"] == 1 and conv["lag"] > 7 * MS
    assert lin["lag"] - conv["lag"] == 8 * 5 * US - 5 * US
    assert conv["host"] == 8 * 106 * US and conv["total"] > conv["host"]


def long_run(b: Backend) -> List[int]:
    """More than LAG_BUCKETS buckets of CPU time: a reference replaced, the zero forgotten."""
    b.set_latency(0, 3 * US)
    with step("idle", device="cuda"):
        b.clock.advance(10 * US)
    b.launch(0, 5 * MS)
    seen = []
    for _ in range(LAG_BUCKETS + 4):
        with step("busy", device="cuda"):
            b.launch(0, 50 * US)
            b.clock.advance(50 * US)
        b.launch(0, LAG_BUCKET_NS)  # the device busy all that time too: still 5 ms behind
        b.clock.advance(LAG_BUCKET_NS)
        registry.resolve()  # read each lag now (drain)
        seen.append(registry.snapshot()[-1].lag)
    return seen


def test_the_lags_zero_follows_the_last_buckets(fake_driver):
    """After LAG_BUCKETS buckets the idle moment is forgotten: lag back to ~0."""
    r = agree(fake_driver, long_run)
    lags = [b - a for a, b in zip([0] + r["obs"], r["obs"])]  # each call's own lag
    assert lags[0] == 5 * MS
    assert all(lag == pytest.approx(5 * MS, abs=1 * US) for lag in lags[:LAG_BUCKETS])
    assert all(lag < LAG_FLOOR_NS for lag in lags[LAG_BUCKETS:])


def device_errors(b: Backend) -> None:
    """Device errors at each driver call a step makes: untimed, nothing raises."""
    with step("ok", device="cuda"):
        b.clock.advance(10 * US)
    b.fail("cuEventRecord")  # the start record
    with step("ok", device="cuda"):
        b.clock.advance(10 * US)
    with step("ok", device="cuda"):
        b.fail("cuEventRecord")  # the end record
        b.clock.advance(10 * US)
    with step("ok", device="cuda"):
        b.clock.advance(10 * US)
    registry.resolve()
    b.fail("cuEventElapsedTime")  # the pair's own time: unreadable
    with step("ok", device="cuda"):
        b.clock.advance(10 * US)
    registry.resolve()
    b.fail("cuEventElapsedTime", after=1)  # its lag only: timed, no lag
    with step("ok", device="cuda"):
        b.clock.advance(10 * US)
    with pytest.raises(ValueError):
        with step("ok", device="cuda"):
            b.clock.advance(10 * US)
            raise ValueError
    assert depth() == 0


def test_device_errors_leave_steps_untimed_and_balanced(fake_driver):
    """A failing record or read: untimed, no exception, depth 0."""
    # a failed end's start goes back to the pool; an unreadable pair's events are not reused
    r = agree(fake_driver, device_errors, calls=_COUNTED[1:])
    assert r["calls"]["cuEventCreate"] == 9
    ok = row(r, "ok")
    assert ok["untimed"] == 3 and ok["count"] == 4 and ok["errors"] == 1
    assert ok["dcalls"] == 3  # the one read without its lag has none
    assert ok["host"] == 3 * 10 * US


def capture(b: Backend) -> bool:
    """A capturing stream: nothing recorded (the graph would break), the call untimed."""
    with step("conv", device="cuda"):
        b.clock.advance(10 * US)
    b.capture(True)
    with step("conv", device="cuda"):
        with step("lin"):
            b.clock.advance(10 * US)
    b.capture(False)
    with step("conv", device="cuda"):
        b.capture(True)  # capture begun inside the step: its end is not recorded
        b.clock.advance(10 * US)
    b.capture(False)
    return b.broken()


def agree_capture(fake_driver: Tuple[Path, Any]) -> Dict[str, Any]:
    """As :func:`agree`: the twin (torch) asks about a capture at the start only, so its
    end record on a stream that began capturing fails, and breaks the capture."""
    with native_clock(fake_driver) as b:
        c = {"stats": _stats_after(b, capture), "calls": b.counts()}
        c["obs"] = b.broken()
    with twin_clock() as t:
        twin = _stats_after(t, capture)
        assert t.broken()  # the twin's end record hit the capturing stream
    assert c["stats"] == twin
    return c


def _stats_after(b: Backend, scenario: Scenario) -> Dict[str, Tuple[int, ...]]:
    scenario(b)
    return _stats()


def test_capture_is_untimed_and_not_broken_by_the_c_clock(fake_driver):
    """Capturing: untimed; the C clock records nothing on the capturing stream."""
    r = agree_capture(fake_driver)
    conv = row(r, "conv")
    assert conv["count"] == 1 and conv["untimed"] == 2 and row(r, "conv/lin")["untimed"] == 1
    assert r["obs"] is False  # the C clock asked cuStreamIsCapturing first
    assert r["calls"]["cuEventRecord"] == 3


def polling(b: Backend) -> List[Any]:
    """poll_at 4: the finished pairs at the front are folded, none waited for."""
    obs = []
    registry.pending.poll_at = 4
    try:
        b.set_latency(0, 3 * US)
        for _ in range(3):
            with step("x", device="cuda"):
                b.launch(0, 100 * US)
                b.clock.advance(10 * US)
        obs.append(len(registry.pending))
        b.progress(0, b.tail(0) - 50 * US)  # the device finished the first two pairs
        with step("x", device="cuda"):  # the 4th pending pair: a poll
            b.clock.advance(10 * US)
        obs.append(len(registry.pending))
        obs.append(b.counts()["cuEventSynchronize"])
        obs.append(sum(e.count for e in registry.entries()))
        obs.append(b.counts()["cuEventSynchronize"])  # entries() drained: 2 per pair left
    finally:
        registry.pending.poll_at = 2048
    return obs


#: The driver calls both clocks make alike, the reads aside: the C clock asks a pair's own
#: time instead of querying its end first (one call a finished pair, and one a poll that stops).
_UNREAD = tuple(c for c in _COUNTED if c not in ("cuEventQuery", "cuEventElapsedTime"))


def test_polling_folds_finished_pairs_without_waiting(fake_driver):
    """poll_at: folds the finished front, never synchronizes; C queries the newest end once."""
    r = agree(fake_driver, polling, calls=_UNREAD)
    assert r["obs"] == [3, 2, 0, 4, 4]
    assert r["calls"]["cuEventQuery"] == 1


def finished_poll(b: Backend) -> List[int]:
    """Ten pairs on one stream, all finished: one poll reads them."""
    b.set_latency(0, 3 * US)
    for _ in range(10):
        with step("x", device="cuda"):
            b.clock.advance(10 * US)
    b.progress(0, b.clock.now + 1 * MS)  # the device has run everything
    return [registry.pending.poll(), len(registry.pending)]


def test_a_poll_reads_finished_pairs_with_two_driver_calls_each(fake_driver):
    """C: a finished pair costs its own time and its lag's (the first pair's end becomes the
    lags' reference: one read less), the poll one query of the newest end."""
    r = agree(fake_driver, finished_poll, calls=_UNREAD)
    assert r["obs"] == [10, 0]
    assert r["calls"]["cuEventQuery"] == 1 and r["calls"]["cuEventElapsedTime"] == 19


def many_calls(b: Backend) -> List[int]:
    """100 calls of one step, the device keeping up; then everything read."""
    for _ in range(100):
        with step("x", device="cuda"):
            b.launch(0, 1 * US)
            b.clock.advance(10 * US)
    b.progress(0, b.clock.now + 1 * MS)
    return [registry.pending.poll(), b.counts()["cuEventElapsedTime"]]


def test_a_steps_lag_is_read_for_its_first_32_calls_then_one_in_8(fake_driver):
    """Each lag is a second driver read (2 us in situ on an H100): the first LAG_ALL of a step,
    then one call in LAG_EVERY (calls 32, 40, ..., 96 here: its buffer's length a multiple
    of 8); host time read with it. Both clocks decide the same."""
    r = agree(fake_driver, many_calls, calls=_UNREAD)
    x = row(r, "x")
    assert x["count"] == 100 and x["dcalls"] == x["caught"] == 32 + 9
    assert x["host"] == 41 * 10 * US and x["total"] == 100 * 10 * US
    assert r["obs"] == [100, 100 + 41 - 1]  # its own read each, the lags' (the first: none)


def hard_limit(b: Backend) -> List[int]:
    """hard_limit 3 and nothing finished: only the oldest pair's end is waited for."""
    registry.pending.poll_at, registry.pending.hard_limit = 2, 3
    try:
        for _ in range(3):
            with step("x", device="cuda"):
                b.clock.advance(10 * US)
        return [len(registry.pending), b.counts()["cuEventSynchronize"], b.last_synced()]
    finally:
        registry.pending.poll_at, registry.pending.hard_limit = 2048, 65536


def test_the_hard_limit_waits_for_the_oldest_pair_only(fake_driver):
    """hard_limit: one cuEventSynchronize, on the first end event."""
    r = agree(fake_driver, hard_limit, calls=_UNREAD)
    assert r["obs"] == [2, 1, 2]  # the 2nd record: the first pair's end


def bounded(b: Backend) -> List[int]:
    """A device that never catches up: the queue and the events stay bounded."""
    registry.pending.poll_at, registry.pending.hard_limit = 16, 64
    most = 0
    try:
        for _ in range(500):
            with step("x", device="cuda"):
                b.launch(0, 1 * MS)
                b.clock.advance(10 * US)
            most = max(most, len(registry.pending))
        return [most, registry.summary()["x"].count]
    finally:
        registry.pending.poll_at, registry.pending.hard_limit = 2048, 65536


def test_the_queue_and_the_pool_stay_bounded(fake_driver):
    """Never caught up: fewer than hard_limit pending, events reused."""
    r = agree(fake_driver, bounded, calls=_UNREAD)
    assert r["obs"] == [63, 500]
    assert r["calls"]["cuEventCreate"] < 2 * 64 + 4


def behind(b: Backend) -> List[int]:
    """A device far behind (each step 1 ms of work, 10 us of host): no pair finishes."""
    registry.pending.poll_at, registry.pending.hard_limit = 16, 4096
    try:
        for _ in range(400):
            with step("x", device="cuda"):
                b.launch(0, 1 * MS)
                b.clock.advance(10 * US)
        return [len(registry.pending)]
    finally:
        registry.pending.poll_at, registry.pending.hard_limit = 2048, 65536


def test_a_device_behind_is_not_asked_at_every_step(fake_driver):
    """Past poll_at with nothing finished, a poll waits for a quarter of poll_at more pairs:
    a driver read every 4 steps here, not one a step (a read that flushes the driver's work)."""
    runs = {}
    for make in (lambda: native_clock(fake_driver), twin_clock):
        with make() as b:
            speedups.cuda_tally(True)
            obs = behind(b)
            runs[b.name] = (obs, b.counts(), speedups.cuda_tally(False))
    assert runs["C"][0] == runs["twin"][0] == [400]
    reads = {"C": runs["C"][1]["cuEventElapsedTime"], "twin": runs["twin"][1]["cuEventQuery"]}
    assert reads["C"] == reads["twin"] and reads["C"] <= (400 - 16) // 4 + 1
    tally = runs["C"][2]  # the C queue's own account of the same
    assert tally["polls"] == tally["unready"] == reads["C"]
    assert tally["folded"] == tally["waits"] == 0
    assert tally["records"] == 800  # (its ns read the fake host clock, which stood still)


def test_the_polls_parts_add_up_to_the_polls_time(fake_driver):
    """cuda_tally(2) (benchmarks/cuda_step.py): a poll's time in laps, each CPU clock read one
    tick here, so the parts add up to the polls' time less the two reads around each poll."""
    tick = 100
    with native_clock(fake_driver) as b:
        registry.pending.poll_at = 16

        def ticking() -> int:
            b.clock.advance(tick)
            return b.clock()

        previous = set_cpu_clock(ticking)
        try:
            speedups.cuda_tally(2)
            for _ in range(100):
                with step("x", device="cuda"):
                    b.launch(0, 1 * US)
                    b.clock.advance(10 * US)
                b.progress(0, b.clock.now)  # the device keeps up: each poll folds
            t = speedups.cuda_tally(0)
        finally:
            set_cpu_clock(previous)
            registry.pending.poll_at = 2048
    parts = t["poll_parts_ns"]
    assert list(parts) == [
        "query of the newest end",
        "read of a pair",
        "context",
        "lag",
        "timeline",
        "fold in C",
        "the registry's fold (Python)",
        "fold in Python (sampled, retired, unreadable)",
        "release",
        "wait",
        "other",
    ]
    assert t["polls"] > 0 and t["folded"] > 0
    assert sum(parts.values()) == t["poll_ns"] - 2 * tick * t["polls"]
    for part in (
        "query of the newest end",
        "read of a pair",
        "context",
        "lag",
        "fold in C",
        "release",
        "other",
    ):
        assert parts[part] > 0, part
    assert parts["wait"] == 0
    assert speedups.cuda_tally(0)["poll_parts_ns"]["read of a pair"] == 0  # read, then zeroed


def test_the_read_benchmark_reads_every_pair_in_its_three_settings(fake_driver):
    """cuda_bench_reads (benchmarks/cuda_step.py): the fake device stands still while the
    host sleeps, so only the round that waits for the newest end reads every pair."""
    with native_clock(fake_driver) as b:
        b.set_latency(0, 3 * US)
        got = speedups.cuda_bench_reads(0, 50, 1.0)
        assert b.counts()["cuEventSynchronize"] == 4  # the third round's wait, each round's end
    assert list(got) == [
        "nothing asked before",
        "after a query of the newest end",
        "after a wait for it",
    ]
    assert got["nothing asked before"]["not ready"] == 2 * 2 * 50
    assert got["after a wait for it"]["not ready"] == 0
    assert all(r["first read"] >= 0 and r["second read"] >= 0 for r in got.values())


def drain_at_summary(b: Backend) -> List[int]:
    """Nothing read until summary(), which waits for each pair."""
    for _ in range(3):
        with step("x", device="cuda"):
            b.launch(0, 1 * MS)
            b.clock.advance(10 * US)
    obs = [len(registry.pending), b.counts()["cuEventSynchronize"]]
    s = registry.summary()
    return obs + [len(registry.pending), b.counts()["cuEventSynchronize"], s["x"].count]


def test_summary_drains_the_queue(fake_driver):
    """summary(): every pair waited for (start and end) and folded."""
    r = agree(fake_driver, drain_at_summary)
    assert r["obs"] == [3, 0, 0, 6, 3]


def reuse(b: Backend) -> List[int]:
    """Three rounds of a step and a summary: the pool's events come back."""
    for _ in range(3):
        with step("x", device="cuda"):
            b.clock.advance(10 * US)
        registry.summary()
    return [b.counts()["cuEventCreate"]]


def test_events_are_created_once_then_reused(fake_driver):
    """Pool: 3 events for 3 rounds (one kept as the lags' reference)."""
    r = agree(fake_driver, reuse)
    assert r["calls"]["cuEventCreate"] == 3 and r["calls"]["cuEventRecord"] == 6


def on_device_1(b: Backend) -> None:
    """Steps on device 1 while device 0 is current; children inherit device 1."""
    b.set_latency(1, 4 * US)
    for _ in range(3):
        with step("conv", device="cuda:1"):
            b.launch(1, 30 * US)
            b.clock.advance(20 * US)
            with step("lin"):
                b.clock.advance(5 * US)
        with step("head", device="cuda"):  # the current device: 0
            b.clock.advance(3 * US)


def test_steps_on_another_device_agree(fake_driver):
    """Device 1 from device 0's thread: same stats as the twin."""
    r = agree(fake_driver, on_device_1)
    assert row(r, "conv")["dcalls"] == 3 and row(r, "conv/lin")["dcalls"] == 3
    assert row(r, "head")["host"] == 3 * 3 * US


def timeline_slots(b: Backend) -> List[Any]:
    """The timeline on: each call's GPU slot gets its times after the device's reference."""
    slots = []
    b.set_latency(0, 3 * US)
    with configure(timeline=10):
        for _ in range(3):
            b.clock.advance(100 * US)
            with step("conv", device="cuda"):
                slots.append(thread_stack()[-1].gpu)
                b.launch(0, 70 * US)
                b.clock.advance(20 * US)
        registry.summary()
    return [(s.start_ms, s.end_ms) for s in slots]


def test_the_timeline_slots_get_their_times(fake_driver):
    """GpuSlot start_ms/end_ms from the reference event, as the twin's."""
    r = agree(fake_driver, timeline_slots)
    first, *_, last = r["obs"]
    # the reference recorded with the first start; each call 120 us after the last on the host
    assert first == pytest.approx((0.0, 0.07)) and last == pytest.approx((0.24, 0.31))


def across_reset(b: Backend) -> None:
    """A step open across registry.reset() is recorded whole in the new tree."""
    with step("x", device="cuda"):
        b.clock.advance(10 * US)
    with step("x", device="cuda"):
        b.clock.advance(5 * US)
        registry.reset()
        b.clock.advance(6 * US)


def test_a_step_open_across_a_reset(fake_driver):
    """Reset inside a CUDA step: the call lands in the new tree."""
    r = agree(fake_driver, across_reset)
    assert r["stats"] == {
        "x": (1, 11 * US, 121 * US * US, 11 * US, 11 * US, 0, 0, 11 * US, 1, 0, 1)
    }


def test_reset_forgets_the_pending_pairs(fake_driver):
    """registry.reset(): the C queue emptied, nothing waited for or folded."""
    with native_clock(fake_driver) as b:
        for _ in range(3):
            with step("x", device="cuda"):
                b.clock.advance(10 * US)
        assert speedups.cuda_pending() == 3
        registry.reset()
        assert speedups.cuda_pending() == 0 and len(registry.pending) == 0
        assert registry.snapshot() == []
        assert b.counts()["cuEventSynchronize"] == 0
        assert b.counts()["cuEventElapsedTime"] == 0


def test_reset_gives_the_forgotten_events_back(fake_driver):
    """After reset(), every live event is in a pool (none leaked)."""
    _, lib = fake_driver
    with native_clock(fake_driver) as b:
        for _ in range(3):
            with step("x", device="cuda"):
                b.clock.advance(10 * US)
        registry.reset()
        assert lib.fake_live_events() == speedups.cuda_available(0)


# -- the C clock alone: its calls, contexts, streams, fast path ---------------------------


def test_the_raw_calls_create_record_query_read_and_pool(fake_driver):
    """cuda_record/query/elapsed/put/available over the driver."""
    _, lib = fake_driver
    with native_clock(fake_driver) as b:
        a = speedups.cuda_record(0)
        b.clock.advance(1_250 * US)
        z = speedups.cuda_record(0)
        assert lib.fake_event_device(a) == lib.fake_event_device(z) == 0
        assert lib.fake_calls(b"cuEventCreate") == 2
        assert speedups.cuda_query(z) is False
        with pytest.raises(RuntimeError, match="error 600"):  # not finished yet
            speedups.cuda_elapsed(a, z)
        lib.fake_complete_all()
        assert speedups.cuda_query(z) is True
        assert speedups.cuda_elapsed(a, z) == pytest.approx(1.25)
        speedups.cuda_put(0, a)
        speedups.cuda_put(0, z)
        assert speedups.cuda_available(0) == 2
        assert speedups.cuda_record(0) == z  # the last one back, taken first
        assert lib.fake_calls(b"cuEventCreate") == 2 and speedups.cuda_available(0) == 1
        lib.fake_fail_next(b"cuEventRecord", ERR_RECORD)
        with pytest.raises(RuntimeError, match="cuEventRecord failed .error 700"):
            speedups.cuda_record(0)
        assert lib.fake_live_events() == 1  # the failed one destroyed, the other pooled: 2-1
        assert speedups.cuda_available(0) == 0
        speedups.cuda_put(0, z)
        with pytest.raises(ValueError):
            speedups.cuda_query(0)


def test_bench_records_times_raw_records(fake_driver):
    """cuda_bench_records: n records of one event, then it is pooled."""
    _, lib = fake_driver
    with native_clock(fake_driver):
        assert speedups.cuda_bench_records(0, 10) >= 0.0
        assert lib.fake_records() == 11 and lib.fake_calls(b"cuEventSynchronize") == 1
        assert speedups.cuda_available(0) == 1 and lib.fake_live_events() == 1


def test_the_stream_recorded_on_is_the_raw_stream_of_the_steps_device(fake_driver):
    """Records go on raw_stream(dev); device 1's events are device 1's."""
    _, lib = fake_driver
    with native_clock(fake_driver) as b:
        handles = []
        for _ in range(2):  # the first call of a path goes through Python, the second C
            with step("conv", device="cuda:1"):
                handles.append(thread_stack()[-1].event)
                assert lib.fake_last_stream() == b.streams[1]
                with step("lin"):
                    handles.append(thread_stack()[-1].event)
                assert lib.fake_current_device() == 0  # device 1's context popped again
        assert all(type(h) is int and lib.fake_event_device(h) == 1 for h in handles)
        assert lib.fake_last_stream() == b.streams[1]
        pushes = lib.fake_calls(b"cuCtxPushCurrent")
        assert pushes == 8 and lib.fake_calls(b"cuCtxPopCurrent") == pushes
        with step("head", device="cuda:0"):  # device 0 is current: nothing pushed
            pass
        assert lib.fake_calls(b"cuCtxPushCurrent") == pushes
        assert lib.fake_last_stream() is None  # device 0's raw stream: the default, 0
        assert lib.fake_retained(0) == lib.fake_retained(1) == 1  # retained once each
        registry.summary()
        assert lib.fake_calls(b"cuCtxPopCurrent") == lib.fake_calls(b"cuCtxPushCurrent")
        assert lib.fake_ctx_depth() == 1


def test_a_thread_without_a_context_gets_one_pushed_and_popped(fake_driver):
    """A fresh thread (no current context): push, record, pop."""
    _, lib = fake_driver
    seen: List[Any] = []

    def work(b: Native) -> None:
        try:
            seen.append(lib.fake_ctx_depth())
            for _ in range(2):
                with step("worker", device="cuda:0"):
                    seen.append(lib.fake_current_device())
                    b.clock.advance(10 * US)
            seen.append(lib.fake_ctx_depth())
        except BaseException as exc:  # pragma: no cover - shown by the assert below
            seen.append(exc)

    with native_clock(fake_driver) as b:
        t = threading.Thread(target=work, args=(b,))
        t.start()
        t.join()
        assert seen == [0, -1, -1, 0]
        assert lib.fake_calls(b"cuCtxPushCurrent") == 4 == lib.fake_calls(b"cuCtxPopCurrent")
        (s,) = registry.snapshot()
        assert s.path == "worker" and s.count == s.dcalls == 2 and s.host == 2 * 10 * US


def test_the_fast_path_times_cuda_steps_in_c(fake_driver):
    """After a path's first call: no Step._enter, no torch Event, records seen."""
    _, lib = fake_driver
    with native_clock(fake_driver) as b:
        with step("conv", device="cuda"):
            with step("lin"):
                pass
        assert b.enters == 2
        records = lib.fake_records()
        for _ in range(10):
            with step("conv", device="cuda"):
                with step("lin"):
                    b.clock.advance(1 * US)
        assert b.enters == 2 and lib.fake_records() == records + 40
        assert speedups.cuda_pending() == 22


def test_loading_needs_an_empty_queue_and_a_whole_driver(fake_driver, tmp_path):
    """cuda_load: a reason for a missing library or function; refused while pairs wait."""
    path, lib = fake_driver
    with native_clock(fake_driver) as b:
        with step("x", device="cuda"):
            b.clock.advance(1 * US)
        with pytest.raises(RuntimeError, match="pending"):
            speedups.cuda_load(str(path))
        registry.resolve()
    assert "cannot load" in speedups.cuda_load(str(tmp_path / "nothing.so"))
    lib.fake_fail_next(b"cuInit", 3)
    assert speedups.cuda_load(str(path)) == "cuInit failed (error 3)"
    partial = _compile(tmp_path / "libpartial.so", "-DFAKE_WITHOUT_CAPTURE_QUERY")
    why = speedups.cuda_load(str(partial))
    assert why is not None and "lacks a CUDA driver function" in why
    assert speedups.cuda_load(str(path)) is None  # a whole table again (see the next test)


def test_a_failed_load_keeps_the_driver_in_use(fake_driver, tmp_path):
    """After a good load, a failed one leaves the first one working (no crash)."""
    path, _ = fake_driver
    partial = _compile(tmp_path / "libpartial.so", "-DFAKE_WITHOUT_CAPTURE_QUERY")
    code = (
        "from instrumented_convs.core.native import speedups as s\n"
        f"assert s.cuda_load({str(path)!r}) is None\n"
        f"assert 'lacks' in s.cuda_load({str(partial)!r})\n"
        "from instrumented_convs.core.storage.entry import Entry\n"
        "s.cuda_bind(lambda: 0, lambda d: 0, print, Entry)\n"
        "print('record', s.cuda_record(0))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert out.returncode == 0, out.stderr[-2000:]
