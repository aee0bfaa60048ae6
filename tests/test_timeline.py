"""The timeline: every call's start and end per thread, as a Chrome trace (exact fake clocks)."""

from __future__ import annotations

import gzip
import json
import threading

import pytest
import torch

from instrumented_convs import configure, region, registry
from instrumented_convs.core.native import IMPLEMENTATION
from instrumented_convs.layers import mark_outputs, step
from instrumented_convs.report import Timeline
from instrumented_convs.report.timeline import merge_traces, read_trace
from instrumented_convs.testing import FakeClock, cpu_clock, cuda_event_factory, depth

from .fakes import FakeEvent
from .helpers import assert_nested, spans


def test_off_by_default_and_records_nothing():
    with step("a"):
        pass
    assert configure().timeline == 0
    tl = registry.timeline()
    assert len(tl) == 0 and not tl.recording and not tl.truncated


def test_each_call_with_its_exact_start_and_end_nested_on_its_thread():
    clock = FakeClock(start=5_000)
    with cpu_clock(clock):
        configure(timeline=100)
        with region("epoch"):
            clock.advance(10)
            for _ in range(2):
                with step("layer"):
                    clock.advance(100)
                    with step("inner"):
                        clock.advance(30)
                    clock.advance(5)
    tl = registry.timeline()
    assert [(c[1], c[5], c[6]) for c in tl.calls] == [
        ("epoch/layer/inner", 5_110, 5_140),
        ("epoch/layer", 5_010, 5_145),
        ("epoch/layer/inner", 5_245, 5_275),
        ("epoch/layer", 5_145, 5_280),
        ("epoch", 5_000, 5_280),
    ]
    assert {c[7] for c in tl.calls} == {threading.get_ident()}
    trace = tl.to_chrome(pid=7, name="rank 0")
    assert_nested(trace)
    x = spans(trace)
    base = trace["otherData"]["base_ns"]
    offset = tl._offset
    inner = [e for e in x if e["name"] == "inner"]
    assert [round(e["ts"] * 1e3) + base - offset for e in inner] == [5_110, 5_245]
    assert [e["dur"] for e in inner] == [0.03, 0.03]  # microseconds
    assert {e["tid"] for e in x} == {1} and {e["pid"] for e in x} == {7}
    assert inner[0]["args"] == {
        "path": "epoch/layer/inner",
        "scope": None,
        "phase": "forward",
        "kind": "step",
    }
    meta = {(e["name"], e.get("tid")): e["args"] for e in spans(trace, "M")}
    assert meta[("process_name", None)] == {"name": "rank 0"}
    assert meta[("thread_name", 1)] == {"name": "main thread"}


def test_forward_calls_link_to_their_backward_by_flow_arrows():
    configure(timeline=1000, backward_every=1)
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    for _ in range(3):
        with step("layer"):
            with step("lin"):
                h = mark_outputs(lin(x))
            with step("act"):
                out = mark_outputs(torch.relu(h).sum())
        out.backward()
    trace = registry.timeline().to_chrome()
    assert_nested(trace)
    x_events = spans(trace)
    backward = [e for e in x_events if e["cat"] == "backward"]
    assert sorted({e["name"] for e in backward}) == [
        "act [backward]",
        "layer [backward]",
        "lin [backward]",
    ]
    starts, ends = spans(trace, "s"), spans(trace, "f")
    assert len(starts) == len(ends) == len(backward) == 9
    by_id = {e["id"]: e for e in starts}
    for f in ends:  # each arrow: from a forward call of the same step to its backward
        s = by_id[f["id"]]
        src = [e for e in x_events if e["ts"] == s["ts"] and e["cat"] == "forward"]
        dst = [e for e in backward if e["ts"] == f["ts"]]
        assert src and dst and src[0]["name"] + " [backward]" == dst[0]["name"]
        assert s["ts"] < f["ts"]


def test_the_limit_cuts_the_timeline_everywhere_and_says_so():
    configure(timeline=3)
    for _ in range(5):
        with step("a"):
            pass
    tl = registry.timeline()
    assert len(tl) == 3 and tl.truncated and not tl.recording
    trace = tl.to_chrome()
    notes = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert len(notes) == 1 and "limit of 3 calls" in notes[0]["name"]
    assert (
        trace["otherData"]["instrumented_convs"][
            str(next(iter(trace["otherData"]["instrumented_convs"])))
        ]["truncated"]
        is True
    )
    registry.reset()  # empties it and records again
    with step("b"):
        pass
    tl = registry.timeline()
    assert [c[0] for c in tl.calls] == ["b"] and tl.recording and not tl.truncated


def test_turning_it_off_keeps_what_was_recorded_and_on_again_starts_anew():
    configure(timeline=10)
    with step("a"):
        pass
    configure(timeline=0)
    with step("b"):
        pass
    assert [c[0] for c in registry.timeline().calls] == ["a"]
    with configure(timeline=10):
        with step("c"):
            pass
        assert [c[0] for c in registry.timeline().calls] == ["c"]
    assert configure().timeline == 0
    with pytest.raises(ValueError):
        configure(timeline=-1)
    with pytest.raises(TypeError):
        configure(timeline=True)


def test_a_call_that_raises_is_on_it_and_the_stacks_stay_balanced():
    configure(timeline=10)
    with pytest.raises(KeyError):
        with step("outer"):
            with step("bad"):
                raise KeyError("x")
    assert depth() == 0
    assert [c[1] for c in registry.timeline().calls] == ["outer/bad", "outer"]


def test_threads_get_tracks_of_their_own_and_a_backward_thread_is_named():
    configure(timeline=1000, backward_every=1)
    lin = torch.nn.Linear(4, 3)
    with step("layer"):
        out = mark_outputs(lin(torch.randn(2, 4)).sum())
    worker = threading.Thread(target=out.backward)  # as autograd's own thread on CUDA
    worker.start()
    worker.join()
    trace = registry.timeline().to_chrome()
    assert_nested(trace)
    names = {e["tid"]: e["args"]["name"] for e in spans(trace, "M") if e["name"] == "thread_name"}
    assert names[1] == "main thread"
    assert names[2] == f"backward (thread {worker.ident})"
    assert {e["tid"] for e in spans(trace) if e["cat"] == "backward"} == {2}
    assert len(spans(trace, "f")) == 1  # the arrow crosses the threads


def _timeline(*calls: tuple) -> Timeline:
    """A finished timeline of these calls, the main thread's id 9, no wall-clock offset."""
    return Timeline(
        {
            "calls": list(calls),
            "limit": 10,
            "recording": False,
            "truncated": None,
            "main_thread": 9,
            "wall_offset_ns": 0,
        }
    )


def test_overlapping_calls_move_to_a_track_of_their_own():
    tl = _timeline(
        ("a", "a", None, "step", "forward", 0, 100, 9, -1, None),
        ("b", "b", None, "step", "forward", 50, 150, 9, -1, None),  # overlaps a
        ("c", "a/c", None, "step", "forward", 10, 20, 9, -1, None),
    )
    trace = tl.to_chrome(pid=1)
    assert_nested(trace)
    tids = {e["name"]: e["tid"] for e in spans(trace)}
    assert tids["a"] == tids["c"] == 1 and tids["b"] != 1
    names = {e["tid"]: e["args"]["name"] for e in spans(trace, "M") if e["name"] == "thread_name"}
    assert names[tids["b"]] == "main thread (overlapping calls)"


def test_an_overlapping_call_with_an_arrow_keeps_its_arrow_on_its_own_track():
    # b overlaps a without nesting; its forward links to the backward on thread 8
    tl = _timeline(
        ("a", "a", None, "step", "forward", 0, 100, 9, -1, None),
        ("b", "b", "b#0", "step", "forward", 50, 150, 9, 4, None),
        ("b", "b", "b#0", "step", "backward", 200, 260, 8, (9, 4), None),
    )
    trace = tl.to_chrome(pid=1)
    assert_nested(trace)
    b = next(e for e in spans(trace) if e["name"] == "b")
    (s,), (f,) = spans(trace, "s"), spans(trace, "f")
    assert (s["tid"], s["ts"]) == (b["tid"], b["ts"]) and b["tid"] not in (1, f["tid"])


def test_merged_ranks_keep_their_arrows_apart():
    configure(timeline=100, backward_every=1)
    lin = torch.nn.Linear(4, 3)
    with step("layer"):
        out = mark_outputs(lin(torch.randn(2, 4)).sum())
    out.backward()
    tl = registry.timeline()
    merged = merge_traces([tl.to_chrome(pid=0), tl.to_chrome(pid=1)])
    starts, ends = spans(merged, "s"), spans(merged, "f")
    assert len(starts) == len(ends) == 2
    assert len({e["id"] for e in starts}) == 2  # one id per arrow, ranks apart
    for s in starts:
        (f,) = [e for e in ends if e["id"] == s["id"]]
        assert f["pid"] == s["pid"]


def test_cuda_calls_have_a_gpu_track_from_their_own_events(fake_cuda):  # noqa: F811
    configure(timeline=100)
    clock = FakeClock(start=1_000_000)
    with cpu_clock(clock):
        with step("GCNConv", device="cuda"):
            clock.advance(1_000)
            FakeEvent.timeline += 2.0  # ms on the fake GPU
            with step("lin"):
                clock.advance(500)
                FakeEvent.timeline += 0.5
    assert not any(e.synchronized for e in fake_cuda)  # recording it synchronises nothing
    tl = registry.timeline()  # resolves the pairs, as summary() does
    gpu = {c[0]: c[9] for c in tl.calls}
    ref_ns = 1_000_000  # the reference event: recorded with the first pair, GPU time 0
    assert gpu == {
        "lin": (ref_ns + 2_000_000, ref_ns + 2_500_000),
        "GCNConv": (ref_ns, ref_ns + 2_500_000),
    }
    cpu = {c[0]: (c[5], c[6]) for c in tl.calls}
    assert cpu == {"lin": (1_001_000, 1_001_500), "GCNConv": (1_000_000, 1_001_500)}
    trace = tl.to_chrome()
    assert_nested(trace)
    on_gpu = [e for e in spans(trace) if e["cat"].endswith(",gpu")]
    assert sorted((e["name"], e["dur"]) for e in on_gpu) == [("GCNConv", 2500.0), ("lin", 500.0)]
    names = {e["tid"]: e["args"]["name"] for e in spans(trace, "M") if e["name"] == "thread_name"}
    assert "GPU" in names[on_gpu[0]["tid"]]
    assert len(fake_cuda) == 5  # one pair per step and one reference event, nothing else


class StreamEvent(FakeEvent):
    """A fake CUDA event that remembers the stream it was recorded on."""

    def record(self, stream=None):
        super().record(stream)
        self.stream = stream


def test_the_gpu_reference_is_recorded_on_the_steps_own_device(fake_cuda):  # noqa: F811
    made = []

    def factory():
        made.append(StreamEvent())
        return made[-1]

    configure(timeline=100)
    with cuda_event_factory(factory):
        with step("GCNConv", device="cuda:1"):  # not the current device (0, fake_cuda's)
            FakeEvent.timeline += 1.0
        tl = registry.timeline()
    ref, start, end = made  # the reference event first, then the step's pair
    assert [e.stream for e in made] == ["stream-1"] * 3  # one device, one clock
    assert tl.calls[0][9] is not None


def test_saved_gzip_is_a_chrome_trace_and_ranks_merge_on_one_time_base(tmp_path):
    configure(timeline=10)
    with step("a"):
        pass
    tl = registry.timeline()
    path = tl.save(tmp_path / "t.json.gz", pid=0, name="rank 0")
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    trace = json.loads(gzip.decompress(raw))
    assert trace == read_trace(path)
    assert spans(trace)[0]["name"] == "a"
    other = tl.to_chrome(pid=1, name="rank 1")
    other["otherData"]["base_ns"] += 2_000_000_000  # a rank whose first call came 2 s later
    merged = merge_traces([trace, other])
    a0, a1 = (e for e in spans(merged) if e["name"] == "a")
    assert {a0["pid"], a1["pid"]} == {0, 1}
    assert a1["ts"] - a0["ts"] == pytest.approx(2e6)
    assert merged["otherData"]["base_ns"] == trace["otherData"]["base_ns"]


def test_the_fast_path_in_use_records_the_same_tuples():
    configure(timeline=10)
    with step("outer", device="cpu"):
        with step("inner"):  # the fast path (C when built)
            pass
    calls = registry.timeline().calls
    assert [c[1] for c in calls] == ["outer/inner", "outer"], IMPLEMENTATION
    assert all(isinstance(c[5], int) and c[5] <= c[6] for c in calls)


def test_noted_inputs_go_to_the_call_they_were_given_to():
    from instrumented_convs.core.storage import timeline as _timeline

    configure(timeline=100)
    for n in (3, 5):
        _timeline.note(("region", "forward"), [f"float32[{n}]"])
        with region("forward"):
            _timeline.note("conv1", [f"x{n}"])
            with step("GCNConv", scope="conv1"):
                with step("lin"):  # the layer's own step, not this one, was given them
                    pass
    trace = registry.timeline().to_chrome()
    got = [
        (e["name"], e["args"].get("inputs")) for e in sorted(spans(trace), key=lambda e: e["ts"])
    ]
    assert got == [
        ("forward", ["float32[3]"]),
        ("GCNConv", ["x3"]),
        ("lin", None),
        ("forward", ["float32[5]"]),
        ("GCNConv", ["x5"]),
        ("lin", None),
    ]
    configure(timeline=0)
    _timeline.note("conv1", ["ignored"])  # off: nothing noted
    assert len(registry.timeline().notes) == 2 * 2


class SparseTensor:
    """Stands for torch_sparse's (what the launcher's description reads: sizes and nnz)."""

    def __init__(self, n):
        self.n = n

    def sizes(self):
        return [self.n, self.n]

    def nnz(self):
        return 2 * self.n


def test_a_graph_is_noted_by_identity_and_kept_while_compared():
    from instrumented_convs.commands.launch.inputs import note_inputs

    configure(timeline=100)
    graph = SparseTensor(4)

    def call(*args, **kwargs):
        note_inputs(("conv1",), args, kwargs)
        with step("GCNConv", scope="conv1"):
            pass

    for _ in range(3):
        call(graph, flag=True)  # the same graph, the same flag: one note
    call(graph, flag=1)  # 1 == True, but shown apart
    for n in (6, 7):  # new graphs, each dropped at once: never taken for the one before
        call(SparseTensor(n))
    tl = registry.timeline()
    assert [n[3] for n in tl.notes] == [
        ["SparseTensor[4, 4], nnz 8", "flag=True"],
        ["SparseTensor[4, 4], nnz 8", "flag=1"],
        ["SparseTensor[6, 6], nnz 12"],
        ["SparseTensor[7, 7], nnz 14"],
    ]
    shown = [e["args"]["inputs"] for e in sorted(spans(tl.to_chrome()), key=lambda e: e["ts"])]
    assert shown == [[n[3] for n in tl.notes][i] for i in (0, 0, 0, 1, 2, 3)]
