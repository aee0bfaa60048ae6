"""The optional C fast path (instrumented_convs/core/native/_speedups*.c) and its Python twin.

The whole suite runs with whichever is in use; scripts/test.sh builds the extension, runs
the suite with it (and says so through INSTRUMENTED_CONVS_EXPECT=C), then runs the core
tests again with INSTRUMENTED_CONVS_PURE_PYTHON=1. Here: what only one of them could get
wrong, checked against the other where both exist.
"""

from __future__ import annotations

import copy
import operator
import os
import pickle
import random
import subprocess
import sys
import threading

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs import registry
from instrumented_convs.core import native
from instrumented_convs.core.steps.step import Step
from instrumented_convs.core.storage import entry
from instrumented_convs.layers import step
from instrumented_convs.testing import depth

from .helpers import ROOT, child_env


def test_the_implementation_in_use_is_the_one_expected():
    expected = os.environ.get("INSTRUMENTED_CONVS_EXPECT")
    if expected is None:
        pytest.skip("INSTRUMENTED_CONVS_EXPECT not set (scripts/test.sh sets it)")
    assert native.IMPLEMENTATION == expected


def test_every_c_file_and_python_twin_named_exists():
    """native.TWINS names each C file's Python twins: a file renamed or a twin moved is seen."""
    import importlib

    here = os.path.dirname(native.__file__)
    sources = {f for f in os.listdir(here) if f.endswith(".c")}  # none in a wheel
    assert not sources or sources == set(native.TWINS)
    for names in native.TWINS.values():
        for name in names:
            module, _, attr = f"instrumented_convs.{name}".rpartition(".")
            assert hasattr(importlib.import_module(module), attr), name


def _counters() -> tuple:
    return native.speedups.seq_nr(), torch._C._autograd._get_sequence_nr()


def test_the_c_path_reads_autograds_sequence_counter_as_torch_does_on_every_thread():
    if native.speedups is None:
        pytest.skip("the C extension is not in use")
    if os.environ.get("INSTRUMENTED_CONVS_EXPECT") == "C" and sys.platform.startswith("linux"):
        assert native.speedups.seq_is_native()  # ATen's counter read directly, not the Python call
    seen = {}

    def on_thread(key: str) -> None:
        a = torch.ones(3, requires_grad=True)
        before = _counters()
        b = (a * 2).sum()
        seen[key] = (before, _counters(), b.grad_fn is not None)

    threads = [threading.Thread(target=on_thread, args=(f"t{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    on_thread("main")
    for t in threads:
        t.join()
    for (c0, p0), (c1, p1), made in seen.values():
        assert made and c0 == p0 and c1 == p1 and c1 == c0 + 2


def test_the_counter_address_is_refused_where_the_function_disagrees(monkeypatch):
    py = torch._C._autograd._get_sequence_nr
    assert native.seq_counter_address(py) is not None  # (where it agrees)
    assert native.seq_counter_address(None) is None  # torch's counter not relied on: nor peek
    monkeypatch.setattr(native, "_PEEK", "_ZN2at15sequence_number17get_and_incrementEv")
    assert native.seq_counter_address(py) is None  # moves the counter itself: never agrees
    monkeypatch.setattr(native, "_PEEK", "no_such_symbol_here")
    assert native.seq_counter_address(py) is None


def test_pure_python_can_be_forced_and_records_the_same_steps():
    code = (
        "import instrumented_convs as ic\nfrom instrumented_convs.core import native\nfrom "
        "instrumented_convs.layers import step\n"
        "with step('a'):\n    with step('b'):\n        pass\n    with step('b'):\n        pass\n"
        "print(native.IMPLEMENTATION, [(r.name, r.count) for r in ic.registry.summary()])\n"
    )
    out = {}
    for pure in ("0", "1"):
        env = child_env(INSTRUMENTED_CONVS_PURE_PYTHON=pure)
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        impl, rows = proc.stdout.split(" ", 1)
        out[pure] = (impl, rows.strip())
    assert out["1"][0] == "Python"
    assert out["0"][1] == out["1"][1] == "[('a', 1), ('a/b', 2)]"


@pytest.mark.parametrize(
    "values",
    [
        [5, 1, 9, 3],
        [0],
        [-7, 12, 3],
        [2**40, 3, 2**41],
        [2**62, 2**62],
        list(range(64)),
    ],
)
def test_fold_arithmetic_is_exact(values):
    e = entry.Entry("x", "x", None, "step", None, 0)
    e.buf.extend(values)
    entry.fold_buffer(e)
    assert (e.count, e.total, e.sumsq, e.min, e.max) == (
        len(values),
        sum(values),
        sum(v * v for v in values),
        min(values),
        max(values),
    )
    assert e.buf == []


def test_fold_of_values_beyond_64_bits_falls_back_to_python_ints():
    e = entry.Entry("x", "x", None, "step", None, 0)
    big = [2**70, 1]
    e.buf.extend(big)
    entry.fold_buffer(e)
    assert (e.total, e.sumsq) == (2**70 + 1, 2**140 + 1)


def test_the_c_sums_make_the_reductions_asked_as_the_python_ones_do():
    if native.speedups is None:
        pytest.skip("the Python twin is in use: entry.REDUCTIONS alone")
    values = [5, -1, 9, 2**40, 3]
    kinds = ("max", "sumsq", "cubes", "sum", "min")
    got = native.speedups.sums(values, 4, kinds)
    assert got[2] is None  # a reduction the C does not know: Python makes it
    assert [v for k, v in zip(kinds, got) if k != "cubes"] == [
        entry.REDUCTIONS[k](values[:4]) for k in kinds if k != "cubes"
    ]
    assert native.speedups.sums(values, 2, ()) == ()
    assert native.speedups.sums(values, 0, kinds) is None


def test_a_fold_with_a_reduction_the_c_does_not_know_needs_no_c(monkeypatch):
    cubes = lambda chunk: sum(x**3 for x in chunk)  # noqa: E731
    monkeypatch.setitem(entry.REDUCTIONS, "cubes", cubes)
    # a test's statistic in an unused slot (rtotal): the four of FOLDS are folded as before
    monkeypatch.setattr(entry, "FOLDS", entry.FOLDS + (("rtotal", "cubes", operator.add),))
    e = entry.Entry("x", "x", None, "step", None, 0)
    for chunk in ([5, 1, 9], [-2, 4]):
        e.buf.extend(chunk)
        entry.fold_buffer(e)
    values = [5, 1, 9, -2, 4]
    assert (e.count, e.total, e.sumsq, e.min, e.max, e.rtotal) == (
        5,
        sum(values),
        sum(v * v for v in values),
        -2,
        9,
        cubes(values),
    )


def test_steps_survive_copy_deepcopy_and_pickle():
    for s in (Step("a"), Step("b", scope="L#0"), Step("c", device="cpu"), ic.region("r")):
        for twin in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
            assert type(twin) is type(s)
            assert (
                twin.name,
                twin.scope,
                twin.cuda,
                twin.dev,
                twin.kind,
                twin.key,
                twin.region,
            ) == (s.name, s.scope, s.cuda, s.dev, s.kind, s.key, s.region)
            with twin:
                pass
    assert depth() == 0


def test_threads_keep_their_own_stacks_and_exact_counts():
    def work():
        for _ in range(500):
            with step("outer"):
                with step("inner"):
                    pass

    ts = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    s = registry.summary()
    assert s["outer"].count == 2000 and s["outer/inner"].count == 2000


def test_a_timed_callable_closes_its_step_when_the_call_raises():
    from instrumented_convs.layers.generic import Timed

    st = Step("t")

    def boom(x):
        raise KeyError(x)

    with step("outer"):
        with pytest.raises(KeyError):
            Timed(boom, st)(3)
        assert Timed(lambda a, b=1: a + b, st)(1, b=2) == 3
    s = registry.summary()
    assert s["outer/t"].count == 2 and s["outer/t"].errors == 1
    assert depth() == 0


def test_random_durations_fold_to_the_same_statistics_either_way(clock):
    rng = random.Random(0)
    durations = [rng.randrange(0, 10**6) for _ in range(1000)]
    with step("outer"):
        for d in durations:
            with step("x"):
                clock.advance(d)
    r = registry.summary()["outer/x"]
    assert r.count == 1000 and r.total == pytest.approx(sum(durations) * 1e-9)
    assert r.min == pytest.approx(min(durations) * 1e-9) and r.max == pytest.approx(
        max(durations) * 1e-9
    )
    n = len(durations)
    mean = sum(durations) / n
    std = (sum((d - mean) ** 2 for d in durations) / (n - 1)) ** 0.5
    assert r.std == pytest.approx(std * 1e-9)


def test_a_step_open_while_other_threads_open_and_close_theirs_closes_on_its_own_stack(clock):
    """Threads take turns inside one step of another (the C path remembers the last thread's
    stack): each exit finds its own frame, each path is its thread's own, times are exact."""
    done = []

    def work(k: int) -> None:
        with step(f"t{k}"):
            clock.advance(5)
        done.append(depth())

    with step("outer"):
        clock.advance(1)
        for k in range(3):  # each thread starts and dies while "outer" is open here
            t = threading.Thread(target=work, args=(k,))
            t.start()
            t.join()
            with step("inner"):
                clock.advance(2)
    s = registry.summary()
    assert done == [0, 0, 0] and depth() == 0
    assert s["outer/inner"].count == 3 and s["outer/inner"].total == pytest.approx(6e-9)
    assert [s[f"t{k}"].count for k in range(3)] == [1, 1, 1] and s["t0"].total == pytest.approx(
        5e-9
    )
    assert "outer/t0" not in s and s["outer"].total == pytest.approx(22e-9)


def test_a_frames_start_reads_the_clock_of_its_enter_whichever_path_opened_it(clock):
    """The C enter keeps its clock reading as a C integer; Python reads it as ``start`` (an
    exception's exit is Python's) and a Python enter sets it (an int, nothing else)."""
    from instrumented_convs.core.frames.stack import thread_stack

    t0 = clock.now
    with pytest.raises(ValueError):
        with step("outer"):
            assert thread_stack()[-1].start == t0
            clock.advance(7)
            raise ValueError("bad")
    frame = thread_stack()[0].spare  # the frame "outer" used, kept for reuse
    frame.start = 5  # as a Python enter leaves it
    assert frame.start == 5 and type(frame.start) is int and frame.event is None
    if native.IMPLEMENTATION == "C":
        with pytest.raises(TypeError):
            frame.start = None  # typed: the CPU clock's integer ns only
    with step("outer"):
        assert thread_stack()[-1] is frame and frame.start == t0 + 7
    r = registry.summary()["outer"]
    assert r.count == 2 and r.errors == 1 and r.total == pytest.approx(7e-9)


def test_the_cpu_clock_set_is_the_one_steps_read_at_once_and_the_old_one_is_let_go():
    """set_cpu_clock tells the C fast path, which keeps the function rather than reading
    ``clocks.cpu.cpu_now`` at each step: a new clock is read from the next step, the old
    never again."""
    from instrumented_convs.testing import FakeClock, cpu_clock

    calls = []

    class Counting(FakeClock):
        def __call__(self) -> int:
            calls.append(1)
            return super().__call__()

    with cpu_clock(Counting()):
        with step("a"):
            pass
    n = len(calls)
    with step("a"):
        pass
    s = registry.summary()["a"]
    # read by each enter and exit (its own time too: see Frame.own), never once it is gone
    assert n >= 2 and len(calls) == n and s.count == 2 and s.max > 0
