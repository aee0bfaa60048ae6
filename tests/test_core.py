"""step(), region(), the registry and the switches, timed with an exact fake clock."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading

import pytest

import instrumented_convs as ic
import instrumented_convs.layers as ic_layers
from instrumented_convs import configure, region, registry
from instrumented_convs.layers import current_path, step
from instrumented_convs.testing import depth, open_steps

SEC = 1e-9  # one nanosecond in seconds


def _run_model(clock, epochs=2):
    """forward{GCNConv{gcn_norm{add_remaining_self_loops}, lin}} and backward, exact times."""
    for _ in range(epochs):
        with region("forward"):
            clock.advance(5)
            with step("GCNConv", scope="conv0"):
                with step("gcn_norm"):
                    clock.advance(10)
                    with step("add_remaining_self_loops"):
                        clock.advance(40)
                with step("lin"):
                    clock.advance(30)
                clock.advance(15)
        with region("backward"):
            clock.advance(100)


def test_paths_totals_self_and_means_are_exact(clock):
    _run_model(clock)
    s = registry.summary()
    assert [r.name for r in s] == [
        "forward",
        "forward/GCNConv",
        "forward/GCNConv/gcn_norm",
        "forward/GCNConv/gcn_norm/add_remaining_self_loops",
        "forward/GCNConv/lin",
        "backward",
    ]
    assert s["forward"].count == 2 and s["forward"].kind == "region"
    assert s["forward/GCNConv"].kind == "step"
    assert s["forward"].total == pytest.approx(200 * SEC)
    assert s["forward"].self_time == pytest.approx(10 * SEC)
    assert s["forward/GCNConv"].total == pytest.approx(190 * SEC)
    assert s["forward/GCNConv"].self_time == pytest.approx(30 * SEC)
    assert s["forward/GCNConv/gcn_norm"].total == pytest.approx(100 * SEC)
    assert s["forward/GCNConv/gcn_norm"].self_time == pytest.approx(20 * SEC)
    leaf = s["forward/GCNConv/gcn_norm/add_remaining_self_loops"]
    assert (leaf.count, leaf.mean, leaf.self_time) == (
        2,
        pytest.approx(40 * SEC),
        pytest.approx(80 * SEC),
    )
    assert leaf.depth == 3 and leaf.step == "add_remaining_self_loops"
    assert leaf.parent == "forward/GCNConv/gcn_norm"
    assert s["backward"].mean == pytest.approx(100 * SEC)
    assert s.total == pytest.approx(400 * SEC)


def test_min_max_std_are_exact(clock):
    for ns in (10, 20, 60):
        with step("x"):
            clock.advance(ns)
    r = registry.summary()["x"]
    assert r.min == pytest.approx(10 * SEC) and r.max == pytest.approx(60 * SEC)
    mean = 30.0
    std = math.sqrt(((10 - mean) ** 2 + (20 - mean) ** 2 + (60 - mean) ** 2) / 2)
    assert r.std == pytest.approx(std * SEC)
    assert r.mean == pytest.approx(mean * SEC)


def test_fractions_add_up_at_every_depth(clock):
    _run_model(clock, epochs=3)
    s = registry.summary()
    assert sum(r.fraction for r in s.children(None)) == pytest.approx(1.0)
    assert sum(r.self_fraction for r in s) == pytest.approx(1.0)
    for parent in s:
        kids = s.children(parent.name)
        if kids:
            assert sum(k.fraction for k in kids) + parent.self_fraction == pytest.approx(
                parent.fraction
            )
    assert s["forward"].fraction == pytest.approx(0.5)
    assert s["forward/GCNConv/lin"].fraction == pytest.approx(60 / 400)


def test_group_by_layer_splits_rows_per_scope(clock):
    for layer in ("convs.0", "convs.1", "convs.0"):
        with region("forward"):
            with step("GCNConv", scope=layer):
                with step("lin"):
                    clock.advance(7 if layer == "convs.0" else 3)
    merged = registry.summary()
    assert merged["forward/GCNConv/lin"].count == 3
    assert merged["forward/GCNConv/lin"].total == pytest.approx(17 * SEC)
    assert merged["forward/GCNConv/lin"].scope is None
    split = registry.summary(by="layer")
    rows = [(r.scope, r.name, r.count) for r in split]
    assert rows == [
        (None, "forward", 3),
        ("convs.0", "forward/GCNConv", 2),
        ("convs.0", "forward/GCNConv/lin", 2),
        ("convs.1", "forward/GCNConv", 1),
        ("convs.1", "forward/GCNConv/lin", 1),
    ]
    assert "Layer" in str(split) and "convs.1" in str(split)
    with pytest.raises(ValueError):
        registry.summary(by="nonsense")


def test_merged_rows_stay_in_tree_order_when_scopes_differ(clock):
    # conv b has a child conv a never had: it must be listed under GCNConv, not at the end.
    with step("GCNConv", scope="a"):
        with step("lin"):
            clock.advance(1)
    with step("GCNConv", scope="b"):
        with step("gcn_norm"):
            clock.advance(1)
        with step("lin"):
            clock.advance(1)
    with step("other"):
        clock.advance(1)
    names = [r.name for r in registry.summary()]
    assert names == ["GCNConv", "GCNConv/lin", "GCNConv/gcn_norm", "other"]


def test_decorator_times_each_call_and_reads_the_switch_per_call(clock):
    @step("work")
    def work(n):
        clock.advance(n)
        return n * 2

    assert work(5) == 10
    with configure(enabled=False):
        assert work(7) == 14
    assert work.__name__ == "work"
    r = registry.summary()["work"]
    assert r.count == 1 and r.total == pytest.approx(5 * SEC)

    # decorated while disabled still records once enabled again
    with configure(enabled=False):

        @step("late")
        def late():
            clock.advance(3)

    late()
    assert registry.summary()["late"].count == 1


def test_step_object_is_reentrant_and_recursive(clock):
    s = step("rec")

    def recurse(k):
        with s:
            clock.advance(1)
            if k:
                recurse(k - 1)

    recurse(2)
    names = [r.name for r in registry.summary()]
    assert names == ["rec", "rec/rec", "rec/rec/rec"]
    assert registry.summary()["rec"].total == pytest.approx(3 * SEC)


def test_disabled_records_nothing_and_restores(clock):
    with configure(enabled=False):
        assert not ic.configure().enabled
        with step("x"):
            clock.advance(1)
        with region("y"):
            clock.advance(1)
    assert ic.configure().enabled
    assert len(registry.summary()) == 0
    ic.configure(enabled=False)
    try:
        with step("x"):
            pass
    finally:
        ic.configure(enabled=True)
    assert len(registry.summary()) == 0


def test_env_var_disables_at_import():
    code = (
        "import instrumented_convs as ic\n"
        "from instrumented_convs.layers import step\n"
        "with step('x'): pass\n"
        "print(ic.configure().enabled, len(ic.registry.summary()))\n"
    )
    env = dict(os.environ, INSTRUMENTED_CONVS_DISABLE="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "0"]
    env["INSTRUMENTED_CONVS_DISABLE"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "1"]


@pytest.mark.parametrize(
    "value,asked,backend",
    [
        ("0", "none", "none"),
        ("none", "none", "none"),
        ("off", "none", "none"),
        ("1", "auto", "none"),
        ("auto", "auto", "none"),
        ("torch", "torch", "torch"),
        ("nvtx", "nvtx", "nvtx"),
    ],
)
def test_env_var_nvtx_takes_the_names_configure_takes(value, asked, backend):
    """INSTRUMENTED_CONVS_NVTX: 0/1 or a backend name, the one chosen at import; with no NVTX
    tool attached, auto is none; a backend named is used whether or not a tool listens."""
    if backend == "nvtx":
        pytest.importorskip("nvtx")
    code = (
        "import instrumented_convs as ic; from instrumented_convs.core import settings;"
        " print(settings.NVTX_REQUEST, ic.configure().nvtx)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTX_INJECTION")}
    env["INSTRUMENTED_CONVS_NVTX"] = value
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [asked, backend]


def test_env_var_nvtx_rejects_an_unknown_name_at_import():
    env = dict(os.environ, INSTRUMENTED_CONVS_NVTX="nsys")
    out = subprocess.run(
        [sys.executable, "-c", "import instrumented_convs"], env=env, capture_output=True, text=True
    )
    assert out.returncode != 0
    assert "INSTRUMENTED_CONVS_NVTX must be 0, 1 or one of auto, nvtx, torch, none" in out.stderr


def test_exception_propagates_unchanged_and_stack_stays_balanced(clock):
    err = KeyError("boom")
    with pytest.raises(KeyError) as info:
        with step("outer"):
            with step("inner"):
                clock.advance(4)
                raise err
    assert info.value is err
    assert depth() == 0 and current_path() == ""
    with step("after"):
        clock.advance(2)
    s = registry.summary()
    assert s["outer/inner"].errors == 1 and s["outer"].errors == 1
    assert s["outer/inner"].total == pytest.approx(4 * SEC)
    assert s["after"].count == 1 and s["after"].errors == 0
    assert "raised" in str(s)


def test_bad_step_names_are_rejected_enabled_or_not():
    for bad in ("", "a/b", None, 3):
        with pytest.raises(ValueError):
            step(bad)  # type: ignore[arg-type]
        with configure(enabled=False):
            with pytest.raises(ValueError):
                step(bad)  # type: ignore[arg-type]


def test_threads_have_their_own_nesting_and_exact_counts():
    threads, per_thread = 8, 1000
    barrier = threading.Barrier(threads)
    errors = []

    def worker():
        try:
            barrier.wait()
            for _ in range(per_thread):
                with step("outer"):
                    with step("inner"):
                        pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    s = registry.summary()
    assert [(r.name, r.count) for r in s] == [
        ("outer", threads * per_thread),
        ("outer/inner", threads * per_thread),
    ]


def test_reset_inside_an_open_step_keeps_recording(clock):
    with step("outer"):
        clock.advance(5)
        registry.reset()
        with step("inner"):
            clock.advance(3)
    s = registry.summary()
    assert [(r.name, r.count) for r in s] == [("outer", 1), ("outer/inner", 1)]
    assert s["outer"].total == pytest.approx(8 * SEC)  # recorded whole when it closed
    assert s["outer"].self_time == pytest.approx(5 * SEC)


def test_steps_that_do_not_nest_leave_the_stack_clean(clock):
    def loader():
        with step("load"):
            clock.advance(2)
            yield 1
            clock.advance(2)

    g = loader()
    with step("epoch"):
        next(g)  # "load" is suspended inside "epoch"
        clock.advance(1)
    assert open_steps() == ["epoch/load"]
    with pytest.raises(StopIteration):
        next(g)
    assert depth() == 0
    with step("later"):
        pass
    names = [r.name for r in registry.summary()]
    assert "later" in names and "epoch/later" not in names
    assert registry.summary()["epoch/load"].count == 1


def test_reset_forgets_everything(clock):
    _run_model(clock)
    registry.reset()
    assert len(registry.summary()) == 0
    with step("x"):
        clock.advance(1)
    assert [r.name for r in registry.summary()] == ["x"]


def test_registry_add_is_the_narrow_write_api():
    with pytest.raises(ValueError):
        registry.add("forward//lin", 1.0)
    registry.add("forward/lin", 0.25)
    registry.add("forward/lin", 0.75)
    registry.add("forward", 2.0)
    s = registry.summary()
    assert s["forward/lin"].count == 2 and s["forward/lin"].mean == pytest.approx(0.5)
    assert s["forward"].self_time == pytest.approx(1.0)


def test_registry_memory_stays_flat_over_200_000_steps(clock):
    """Streaming statistics: a step's 200,000 more calls leave its entry as it was (a leak of
    a tenth of a byte a call would exceed the 16 KiB bound; 10^6 calls took 40 s under
    tracemalloc for nothing more)."""
    import gc
    import tracemalloc

    def run(n):
        s = step("a")
        for _ in range(n):
            with s:
                clock.advance(1000)

    run(10_000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        entries = len(registry.entries())
        run(200_000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(registry.entries()) == entries == 1
    assert registry.summary()["a"].count == 210_000
    assert grown < 16 * 1024, f"registry grew by {grown} bytes over 200,000 steps"


def test_configure_returns_the_switches_it_replaced():
    before = ic.configure()
    assert isinstance(before, ic.Settings) and before == ic.configure()  # no argument: a read
    previous = ic.configure(nvtx=False, record_function=False, backward_every=3)
    assert previous == before
    now = ic.configure()
    assert now.nvtx == "none" and not now.record_function and now.backward_every == 3
    assert now.enabled and now.backward == before.backward
    assert ic.configure(nvtx=True).nvtx == "none"  # what it replaced
    assert ic.configure().nvtx == "none"  # auto: no NVTX tool is attached to this process
    previous.restore()
    assert ic.configure() == before


def test_configure_is_a_context_manager_that_puts_every_switch_back(clock):
    before = ic.configure()
    with ic.configure(enabled=False, backward=False, record_function=False) as previous:
        assert previous == before
        assert ic.configure() == before._replace(
            enabled=False, backward=False, record_function=False
        )
        with step("x"):
            clock.advance(1)
    assert ic.configure() == before and len(registry.summary()) == 0
    with pytest.raises(KeyError):  # an exception in the block: propagated, switches put back
        with ic.configure(enabled=False):
            raise KeyError("boom")
    assert ic.configure() == before


def test_configure_checks_every_value_before_changing_any():
    before = ic.configure()
    for bad in (
        dict(nvtx="nsys"),
        dict(nvtx=1),
        dict(backward_every=0),
        dict(backward_every=True),
        dict(enabled=False, nvtx="bogus"),
        dict(record_function=False, backward_every=2.5),
    ):
        with pytest.raises((TypeError, ValueError)):  # TypeError: a value of the wrong type
            ic.configure(**bad)
        assert ic.configure() == before, bad


def test_configure_nvtx_picks_a_backend_and_settings_tell_it():
    before = ic.configure()
    try:
        assert ic.configure(nvtx="none").nvtx == before.nvtx
        assert ic.configure().nvtx == "none"
        ic.configure(nvtx=False)
        assert ic.configure().nvtx == "none"
    finally:
        before.restore()
    assert ic.configure() == before


def test_the_face_is_small_and_points_into_no_private_module():
    import instrumented_convs.layers as layers
    import instrumented_convs.report as report

    assert sorted(ic.__all__) == sorted(
        [
            "region",
            "instrument",
            "uninstrument",
            "name_layers",
            "registry",
            "configure",
            "Settings",
            "advise",
        ]
    )
    assert len(ic.__all__) <= 12
    # besides __all__, only submodules (importing one binds it on the package) and the hook
    # IPython calls for ``%load_ext instrumented_convs`` (a name users never call)
    public = {n for n in vars(ic) if not n.startswith("_")} - {"load_ipython_extension"}
    assert all(type(getattr(ic, n)).__name__ == "module" for n in public - set(ic.__all__)), public
    assert sorted(layers.__all__) == sorted(
        ["step", "Step", "mark_outputs", "recording", "current_path"]
    )
    for mod in (ic, layers, report):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if isinstance(obj, type) or callable(obj):
                # documented under the public module: each public object says so itself
                assert getattr(obj, "__doc__", None), f"{mod.__name__}.{name} has no docstring"


def test_open_steps_and_current_path_follow_the_nesting():
    assert open_steps() == [] and current_path() == "" and depth() == 0
    with region("forward"):
        with step("GCNConv", scope="conv0"):
            assert open_steps() == ["forward", "forward/GCNConv"]
            assert current_path() == "forward/GCNConv" and depth() == 2
        assert open_steps() == ["forward"]
    assert open_steps() == []


def test_layers_module_is_the_step_machinery():
    from instrumented_convs.core.steps import step as _step

    assert _step.Step is ic_layers.Step and _step.step is ic_layers.step
    assert _step.recording is ic_layers.recording and _step.current_path is ic_layers.current_path
    assert ic_layers.recording()
    with ic.configure(enabled=False):
        assert not ic_layers.recording()
    assert _step.depth() == 0


def test_record_function_labels_appear_in_torch_profiler():
    import torch

    x = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with region("forward"):
            with step("lin"):
                x @ x
    names = {e.name for e in prof.events()}
    assert {"forward", "lin"} <= names
    # and the labels nest: lin's matmul runs inside "lin"
    lin = [e for e in prof.events() if e.name == "lin"][0]
    fwd = [e for e in prof.events() if e.name == "forward"][0]
    assert fwd.time_range.start <= lin.time_range.start and lin.time_range.end <= fwd.time_range.end


def test_record_function_switch_off_keeps_labels_out_of_the_profiler():
    import torch

    ic.configure(record_function=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with step("hidden"):
            torch.ones(3) + 1
    assert "hidden" not in {e.name for e in prof.events()}
    assert registry.summary()["hidden"].count == 1


def test_torch_compile_traces_through_steps_without_graph_breaks():
    import torch

    def f(x):
        with region("r"):
            with step("inside"):
                y = torch.sin(x) * 2
            with step("inside2"):
                return y + 1

    x = torch.randn(16)
    explanation = torch._dynamo.explain(f)(x)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    compiled = torch.compile(f, backend="eager")
    assert torch.allclose(compiled(x), f(x))
    assert depth() == 0
    # steps inside compiled code are not recorded; the eager call above recorded them
    assert registry.summary()["r/inside"].count == 1


def test_decorated_function_compiles_without_graph_breaks():
    import torch

    @step("decorated")
    def g(x):
        return x.cos() + 1

    explanation = torch._dynamo.explain(g)(torch.ones(4))
    assert explanation.graph_break_count == 0


def test_testing_clock_helpers_install_and_restore():
    from instrumented_convs.testing import FakeClock, cpu_clock

    with cpu_clock(FakeClock(start=0)) as fake:
        with step("x"):
            fake.advance(7)
        with cpu_clock(FakeClock()) as inner:
            with step("y"):
                inner.advance(3)
        with step("x"):
            fake.advance(1)
    s = registry.summary()
    assert s["x"].total == pytest.approx(8 * SEC) and s["y"].total == pytest.approx(3 * SEC)
    with step("real"):
        pass
    assert registry.summary()["real"].total < 1.0  # the real clock is back


def test_frames_are_reused_without_mixing_up_interleaved_steps(clock):
    # Two generators suspended inside steps, closed out of order, twice over: each step
    # must record its own time into its own path.
    def gen(name, ns):
        with step(name):
            clock.advance(ns)
            yield
            clock.advance(ns)

    for _ in range(2):
        with step("epoch"):
            a, b = gen("a", 1), gen("b", 10)
            next(a)
            next(b)  # "b" opens inside "a"
            with step("inner"):
                clock.advance(100)
            for g in (a, b):  # "a" closes first, while "b" is still open above it
                with pytest.raises(StopIteration):
                    next(g)
    assert depth() == 0
    s = registry.summary()
    assert s["epoch/a"].count == 2 and s["epoch/a/b"].count == 2
    assert s["epoch/a/b/inner"].total == pytest.approx(200 * SEC)
    assert s["epoch/a/b"].total == pytest.approx(2 * (10 + 100 + 1 + 10) * SEC)


def test_a_retired_entry_records_into_the_new_tree():
    with step("outer"):
        registry.reset()
        registry.reset()  # twice: the entry is two trees old
    assert [(r.name, r.count) for r in registry.summary()] == [("outer", 1)]
