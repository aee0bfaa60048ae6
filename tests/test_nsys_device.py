"""``report.nsys.device``: each NVTX range's device time from the CUDA activity of a report.

The reports are built by ``tests/nsys_reports.py`` in nsys's SQLite schema, with chosen times,
so every expected span, busy time and count is known by hand; the ranges come from
``read_ranges``, as the report reader gets them.
"""

from __future__ import annotations

import random
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

from instrumented_convs.report.nsys import device
from instrumented_convs.report.nsys.device import DeviceTime, device_times, has_cuda, lag
from instrumented_convs.report.nsys.ranges import Range, ReportError, read_ranges

from .nsys_reports import Launch, Proc, RangeSpec, build_report, gtid


def times(path: Path) -> Dict[str, Optional[DeviceTime]]:
    """Each range's device time by name (names are unique in these reports)."""
    with closing(sqlite3.connect(str(path))) as conn:
        ranges = read_ranges(conn).ranges
        return {r.name: t for r, t in zip(ranges, device_times(conn, ranges))}


def ranges_and_times(path: Path):
    """The ranges of a report, and their device times."""
    with closing(sqlite3.connect(str(path))) as conn:
        ranges = read_ranges(conn).ranges
        return ranges, device_times(conn, ranges)


def test_a_range_spans_its_kernels_copies_and_memsets(tmp_path: Path) -> None:
    launches = [
        Launch(110, 120, 200, 300),
        Launch(130, 140, 310, 360, kind="memcpy"),
        Launch(150, 160, 370, 380, kind="memset"),
        Launch(170, 400, kind="sync"),  # a call that launched nothing
    ]
    path = build_report(
        tmp_path / "r.sqlite", [Proc(1, {1: [RangeSpec("conv", 100, 1000, launches=launches)]})]
    )
    t = times(path)["conv"]
    assert t == DeviceTime(first=200, last=380, busy=100 + 50 + 10, calls=3)
    assert t.span == 180


def test_a_range_covers_its_nested_ranges_launches(tmp_path: Path) -> None:
    thread = [
        RangeSpec("step", 0, 1000, launches=[Launch(950, 960, 1100, 1200)]),
        RangeSpec("gather", 100, 400, scope="layer1", launches=[Launch(110, 120, 130, 150)]),
        RangeSpec("scatter", 500, 900, launches=[Launch(510, 520, 600, 640)]),
        RangeSpec("inner", 520, 800, launches=[Launch(530, 540, 700, 705)]),
    ]
    path = build_report(tmp_path / "r.sqlite", [Proc(1, {1: thread})])
    ranges, _ = ranges_and_times(path)
    parents = {r.name: ranges[r.parent].name if r.parent >= 0 else None for r in ranges}
    assert parents == {"step": None, "gather": "step", "scatter": "step", "inner": "scatter"}
    t = times(path)
    assert t["step"] == DeviceTime(130, 1200, 20 + 40 + 5 + 100, 4)
    assert t["gather"] == DeviceTime(130, 150, 20, 1)
    assert t["scatter"] == DeviceTime(600, 705, 40 + 5, 2)
    assert t["inner"] == DeviceTime(700, 705, 5, 1)


def test_calls_at_a_ranges_edges_are_its_own(tmp_path: Path) -> None:
    """A call starting at the range's start or end is in it; one a nanosecond out is not."""
    spec = RangeSpec("conv", 100, 200)
    calls = {
        1: [
            Launch(99, 101, 1000, 1001),
            Launch(100, 101, 300, 310),
            Launch(200, 201, 320, 330),
            Launch(201, 202, 400, 410),
        ],
    }
    path = build_report(tmp_path / "r.sqlite", [Proc(1, {1: [spec]}, launches=calls)])
    assert times(path)["conv"] == DeviceTime(300, 330, 20, 2)


def test_another_threads_calls_count_only_through_its_nested_ranges(tmp_path: Path) -> None:
    """Another thread's calls in the range's time do not count, but a backward range on
    autograd's thread that ``read_ranges`` nests under it does: its work is the range's."""
    main = [RangeSpec("backward", 0, 1000, launches=[Launch(10, 20, 30, 40)])]
    autograd = [RangeSpec("conv [backward]", 100, 900, launches=[Launch(110, 120, 130, 230)])]
    other = {3: [Launch(500, 510, 520, 620)]}
    path = build_report(tmp_path / "r.sqlite", [Proc(1, {1: main, 2: autograd}, launches=other)])
    ranges, got = ranges_and_times(path)
    back = next(i for i, r in enumerate(ranges) if r.backward)
    assert ranges[ranges[back].parent].name == "backward"  # nested across threads
    t = {(r.name, r.backward): x for r, x in zip(ranges, got)}
    assert t[("backward", False)] == DeviceTime(30, 230, 110, 2)
    assert t[("conv", True)] == DeviceTime(130, 230, 100, 1)


def test_two_processes_with_the_same_correlation_ids_are_kept_apart(tmp_path: Path) -> None:
    procs = [
        Proc(10, {10: [RangeSpec("a", 0, 100, launches=[Launch(10, 20, 30, 40)])]}),
        Proc(20, {20: [RangeSpec("b", 0, 100, launches=[Launch(10, 20, 50, 90)])]}),
    ]
    path = build_report(tmp_path / "r.sqlite", procs)
    with closing(sqlite3.connect(str(path))) as conn:
        ids = conn.execute("SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    assert ids == [(1,), (1,)]
    t = times(path)
    assert t["a"] == DeviceTime(30, 40, 10, 1)
    assert t["b"] == DeviceTime(50, 90, 40, 1)


def test_an_activity_table_without_global_pid_is_matched_by_id(tmp_path: Path) -> None:
    spec = RangeSpec("a", 0, 100, launches=[Launch(10, 20, 30, 40), Launch(20, 21, 50, 60)])
    path = build_report(
        tmp_path / "r.sqlite", [Proc(7, {7: [spec]})], omit=["CUPTI_ACTIVITY_KIND_KERNEL.globalPid"]
    )
    assert times(path)["a"] == DeviceTime(30, 60, 20, 2)


def test_a_graph_launch_counts_every_node(tmp_path: Path) -> None:
    graph = Launch(10, 20, 30, 40, more=[(45, 60), (60, 100)])
    path = build_report(
        tmp_path / "r.sqlite", [Proc(1, {1: [RangeSpec("a", 0, 50, launches=[graph])]})]
    )
    assert times(path)["a"] == DeviceTime(30, 100, 10 + 15 + 40, 3)


def test_a_call_logged_twice_on_a_thread_counts_once(tmp_path: Path) -> None:
    """A runtime call and the driver call under it, should both carry the activity's id."""
    path = build_report(
        tmp_path / "r.sqlite",
        [Proc(1, {1: [RangeSpec("a", 0, 100, launches=[Launch(10, 20, 30, 40)])]})],
    )
    with closing(sqlite3.connect(str(path))) as conn:
        conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid,"
            " correlationId, nameId, returnValue) VALUES (12, 18, 1, ?, 1, 1, 0)",
            (gtid(1, 1),),
        )
        conn.commit()
    assert times(path)["a"] == DeviceTime(30, 40, 10, 1)


def test_a_range_that_launched_nothing_has_none(tmp_path: Path) -> None:
    thread = [
        RangeSpec("busy", 0, 100, launches=[Launch(10, 20, 30, 40)]),
        RangeSpec("idle", 200, 300, launches=[Launch(210, 290, kind="sync")]),
        RangeSpec("empty", 400, 500),
    ]
    path = build_report(
        tmp_path / "r.sqlite", [Proc(1, {1: thread, 2: [RangeSpec("other", 0, 9)]})]
    )
    t = times(path)
    assert t["busy"] is not None
    assert t["idle"] is None and t["empty"] is None and t["other"] is None


@pytest.mark.parametrize("domain", [True, False])
def test_empty_cuda_tables_give_none(tmp_path: Path, domain: bool) -> None:
    """Tables present but empty, and activity tables absent (nsys writes them lazily)."""
    procs = [Proc(1, {1: [RangeSpec("a", 0, 100)]})]
    path = build_report(tmp_path / "r.sqlite", procs, domain=domain)
    with closing(sqlite3.connect(str(path))) as conn:
        assert has_cuda(conn)
        assert device_times(conn, read_ranges(conn).ranges) == [None]
    omit = [
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET",
    ]
    path = build_report(tmp_path / "r.sqlite", procs, domain=domain, omit=omit)
    with closing(sqlite3.connect(str(path))) as conn:
        assert not has_cuda(conn)
        assert device_times(conn, read_ranges(conn).ranges) == [None]
        assert device_times(conn, []) == []


def test_has_cuda(tmp_path: Path) -> None:
    procs = [Proc(1, {1: [RangeSpec("a", 0, 100, launches=[Launch(10, 20, 30, 40)])]})]
    with closing(sqlite3.connect(str(build_report(tmp_path / "a.sqlite", procs)))) as conn:
        assert has_cuda(conn)
    with closing(sqlite3.connect(str(build_report(tmp_path / "b", procs, cuda=False)))) as conn:
        assert not has_cuda(conn)
        with pytest.raises(ReportError, match="CUPTI_ACTIVITY_KIND_RUNTIME"):
            device_times(conn, read_ranges(conn).ranges)
    no_runtime = build_report(tmp_path / "c", procs, omit=["CUPTI_ACTIVITY_KIND_RUNTIME"])
    with closing(sqlite3.connect(str(no_runtime))) as conn:
        assert not has_cuda(conn)


@pytest.mark.parametrize(
    "table, column",
    [
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "correlationId"),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", "correlationId"),
        ("CUPTI_ACTIVITY_KIND_MEMSET", "end"),
    ],
)
def test_a_missing_column_is_named(tmp_path: Path, table: str, column: str) -> None:
    procs = [Proc(1, {1: [RangeSpec("a", 0, 100, launches=[Launch(10, 20, 30, 40)])]})]
    path = build_report(tmp_path / "r.sqlite", procs, omit=[f"{table}.{column}"])
    with closing(sqlite3.connect(str(path))) as conn:
        ranges = read_ranges(conn).ranges
        with pytest.raises(ReportError) as err:
            device_times(conn, ranges)
    message = str(err.value)
    assert table in message and column in message and "\n" not in message


def test_lag_is_how_far_the_device_ran_past_the_ranges_end(tmp_path: Path) -> None:
    thread = [
        RangeSpec("late", 0, 100, launches=[Launch(10, 20, 30, 40), Launch(50, 60, 70, 250)]),
        RangeSpec("done", 300, 400, launches=[Launch(310, 320, 330, 390)]),
        RangeSpec("edge", 500, 600, launches=[Launch(510, 520, 530, 600)]),
    ]
    ranges, got = ranges_and_times(build_report(tmp_path / "r.sqlite", [Proc(1, {1: thread})]))
    lags = {r.name: lag(t, r) for r, t in zip(ranges, got) if t is not None}
    assert lags == {"late": 150, "done": 0, "edge": 0}


def brute_force(
    ranges: Sequence[Range], calls: Dict[int, List[Launch]]
) -> List[Optional[DeviceTime]]:
    """Each range's device time, call by call (what ``device_times`` finds by bisection):
    its thread's calls within it, and those of its nested ranges on other threads."""
    out: List[Optional[DeviceTime]] = []
    below: Dict[int, List[int]] = {}
    for i, r in enumerate(ranges):
        below.setdefault(r.parent, []).append(i)

    def reached(i: int) -> List[Launch]:
        r = ranges[i]
        mine = [c for c in calls.get(r.gtid, []) if r.start <= c.api_start <= r.end]
        todo = list(below.get(i, []))
        while todo:  # the subtree: a range on another thread brings all it reaches
            j = todo.pop()
            if ranges[j].gtid != r.gtid:
                mine += [c for c in reached(j) if c not in mine]
            else:
                todo += below.get(j, [])
        return mine

    for i in range(len(ranges)):
        mine = [c for c in reached(i) if c.kind != "sync"]
        if not mine:
            out.append(None)
            continue
        out.append(
            DeviceTime(
                first=min(c.dev_start for c in mine),
                last=max(c.dev_end for c in mine),
                busy=sum(c.dev_end - c.dev_start for c in mine),
                calls=len(mine),
            )
        )
    return out


@pytest.mark.parametrize("few", [500, 1])
def test_random_reports_agree_with_a_call_by_call_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, few: int
) -> None:
    """Nested ranges on several threads of two processes, calls everywhere (in and out of
    ranges, some launching nothing): the bisection agrees with counting every call, whether
    SQLite or the loop leaves out the threads without ranges (``few``)."""
    monkeypatch.setattr(device, "_FEW_THREADS", few)
    rng = random.Random(7)
    procs, calls = [], {}
    for pid in (5, 6):
        threads: Dict[int, List[RangeSpec]] = {}
        loose: Dict[int, List[Launch]] = {}
        for tid in (pid, pid + 100):
            specs, t = [], 0
            for i in range(40):
                start = t + rng.randrange(0, 50)
                end = start + rng.randrange(1, 400)
                specs.append(RangeSpec(f"{pid}.{tid}.{i}", start, end))
                if rng.random() < 0.5:  # a child
                    a = rng.randrange(start, end)
                    specs.append(RangeSpec(f"{pid}.{tid}.{i}c", a, rng.randrange(a, end + 1)))
                t = end + rng.randrange(0, 30)
            mine = []
            for _ in range(300):
                s = rng.randrange(0, t + 50)
                d = s + rng.randrange(0, 500)
                kind = rng.choice(["kernel", "memcpy", "memset", "sync"])
                mine.append(Launch(s, s + 3, d, d + rng.randrange(1, 80), kind=kind))
            threads[tid] = specs
            loose[tid] = mine
            calls[gtid(pid, tid)] = mine
        loose[pid + 200] = [Launch(s, s + 1, s + 2, s + 9) for s in range(0, 9000, 7)]
        procs.append(Proc(pid, threads, launches=loose))
    ranges, got = ranges_and_times(build_report(tmp_path / "r.sqlite", procs))
    assert len(ranges) > 160
    assert got == brute_force(ranges, calls)
    assert sum(t is not None for t in got) > 100


GOLDEN = Path(__file__).parent / "golden" / "nsys" / "cora_nvtx.sqlite"


@pytest.mark.skipif(not GOLDEN.exists(), reason="no real nsys report in tests/golden/nsys")
def test_the_builders_tables_are_those_of_a_real_report(tmp_path: Path) -> None:
    """The columns (in order) and the serialized ids of nsys 2022.4's export."""
    path = build_report(tmp_path / "r.sqlite", [Proc(1, {1: [RangeSpec("a", 0, 100)]})])
    real = sqlite3.connect(f"file:{GOLDEN}?mode=ro", uri=True)
    with closing(real), closing(sqlite3.connect(str(path))) as built:
        for table in ("NVTX_EVENTS", "StringIds", "ThreadNames", "PROCESSES"):
            cols = [f"PRAGMA table_info('{table}')"]
            assert [c[1:3] for c in built.execute(*cols)] == [c[1:3] for c in real.execute(*cols)]
        high = "SELECT DISTINCT globalTid >> 48 FROM NVTX_EVENTS"
        assert built.execute(high).fetchall() == real.execute(high).fetchall()


def test_the_lag_floor_is_the_in_process_clocks():
    from instrumented_convs.core.clocks import pending

    assert device.LAG_FLOOR_NS == pending.LAG_FLOOR_NS
