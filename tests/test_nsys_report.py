"""An Nsight Systems report read back as our table (report.nsys, ``view REPORT``): a real
report of nsys 2022.4 (Debian's, as CI installs it; tests/golden/nsys, trimmed to the tables
read) against the table the same process saved, and the command line around it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from instrumented_convs.commands.cli import main as cli_main
from instrumented_convs.commands.launch.runs import saved_summary
from instrumented_convs.report import ReportError, read_report

from .helpers import ROOT
from .nsys_reports import Launch, Proc, RangeSpec, build_report

GOLDEN = Path(__file__).parent / "golden" / "nsys"
REPORT = GOLDEN / "cora_nvtx.sqlite"
#: The run's own entries (``python -m instrumented_convs run`` under ``nsys profile``).
EXPECTED = json.loads((GOLDEN / "cora_nvtx_expected.json").read_text())["entries"]


def _entries(saved):
    s = saved["snapshots"][0]
    return [dict(zip(s["fields"], e)) for e in s["entries"]]


def test_the_report_gives_the_paths_layers_phases_and_counts_the_process_recorded():
    got = _entries(read_report(REPORT))
    key = ("path", "scope", "phase", "kind", "count")
    assert [{k: e[k] for k in key} for e in got] == [{k: e[k] for k in key} for e in EXPECTED]


def test_its_times_are_the_ranges_which_hold_the_tools_own_time():
    """A range lasts from its push to its pop: the tool's time inside (its children's
    enters and exits) is in it, which the process's own clock leaves out. So a row reads
    at least the process's time, and the outermost rows (no step inside to pay for) within
    a tenth of a percent."""
    got = _entries(read_report(REPORT))
    for g, e in zip(got, EXPECTED):
        assert g["total"] >= e["total"] - 1000, g["path"]  # clocks a microsecond apart
    for path in ("epoch",):
        g = next(x for x in got if x["path"] == path)
        e = next(x for x in EXPECTED if x["path"] == path)
        assert abs(g["total"] - e["total"]) <= 0.001 * e["total"]


def test_a_range_that_closes_with_a_time_mark_reads_as_the_steps_own_clock(tmp_path):
    """A range holding the tool's time that the step's clock left out (its children's enters
    and exits) closes with a ``time`` mark of the step's time: that is the call's time, the
    mark going to the innermost range open on its thread; a range without one keeps its
    duration."""
    spec = [
        RangeSpec("epoch", 0, 10_000, payload=1),  # a region
        RangeSpec("GCNConv", 1_000, 9_000, scope="conv1"),
        RangeSpec("lin", 2_000, 3_000, scope="conv1"),  # no mark: its duration
        RangeSpec("propagate", 4_000, 8_000, scope="conv1"),
        RangeSpec("message", 5_000, 6_000, scope="conv1"),
    ]
    marks = [(7_900, "time", 2_500), (8_900, "time", 6_000)]  # propagate's, GCNConv's
    path = build_report(tmp_path / "r.sqlite", [Proc(100, {100: spec}, marks=marks)], cuda=False)
    got = {e["path"]: e["total"] for e in _entries(read_report(path))}
    assert got == {
        "epoch": 10_000,
        "epoch/GCNConv": 6_000,
        "epoch/GCNConv/lin": 1_000,
        "epoch/GCNConv/propagate": 2_500,
        "epoch/GCNConv/propagate/message": 1_000,
    }


def _three_calls(monkeypatch, training: bool) -> tuple:
    """Three calls of a GCNConv (``training``: each in a region ``epoch``, with its backward;
    else without grad) under an ``nvtx`` backend that records its calls: the calls
    (``("push", name, scope, region, cpu)``, ``("pop",)``, ``("time", ns)``) and the rows."""
    pytest.importorskip("torch_geometric")
    import torch

    import instrumented_convs as ic
    from instrumented_convs.core.labels import nvtx
    from instrumented_convs.pyg import GCNConv

    events: list = []

    class Recorder(nvtx.NvtxBackend):
        name = "nvtx"

        def __init__(self):
            super().__init__()
            self.push = lambda name, scope=None, region=False, cpu=False: events.append(
                ("push", name, scope, region, cpu)
            )
            self.pop = lambda: events.append(("pop",))
            self.timed = lambda ns: events.append(("time", ns))

    monkeypatch.setattr(nvtx, "_pick", lambda choice: Recorder())
    conv = GCNConv(4, 4)
    x, ei = torch.randn(10, 4), torch.randint(0, 10, (2, 30))
    start = ic.configure()
    try:
        ic.configure(nvtx="nvtx")
        ic.registry.reset()
        for _ in range(3):  # the first call on Python's path, the others in C
            if training:
                with ic.region("epoch"):
                    conv(x, ei).sum().backward()
            else:
                with torch.no_grad():
                    conv(x, ei)
        rows = ic.registry.summary().rows
    finally:
        start.restore()
        ic.registry.reset()
    return events, rows


def test_a_step_whose_range_holds_the_tools_time_closes_it_with_its_time(monkeypatch):
    """On Python's path and the C fast path alike, a range that holds the tool's own time
    (a layer's, around its steps' enters and exits) closes with a mark of the time the
    process records for the call, just before its pop."""
    events, rows = _three_calls(monkeypatch, training=False)
    layer = next(r for r in rows if r.name.endswith("GCNConv"))
    stack, times = [], []
    for i, ev in enumerate(events):
        if ev[0] == "push":
            stack.append(ev[1])
        elif ev[0] == "pop":
            name = stack.pop()
            if name == "GCNConv":  # its steps' enters and exits inside: marked, then popped
                assert events[i - 1][0] == "time"
                times.append(events[i - 1][1])
    assert len(times) == 3
    assert sum(times) == round(layer.total * 1e9)


def test_warmup_drops_the_first_iterations_with_all_under_them():
    rows = {(r.name, r.phase): r for r in saved_summary(read_report(REPORT, warmup=1)).rows}
    assert rows[("epoch", "forward")].count == 2
    assert rows[("epoch/forward/forward/GCNConv", "forward")].count == 6
    assert rows[("epoch/backward/backward/GCNConv", "backward")].count == 6


def test_by_layer_keeps_each_layers_rows(capsys):
    assert cli_main(["view", str(REPORT), "--by", "layer", "--depth", "3", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    for scope in ("convs.0", "convs.1", "convs.2"):
        assert f"epoch/forward/forward/GCNConv,GCNConv,3,{scope},step,3," in out


def test_view_prints_the_table_and_saves_a_run_folder_that_diff_reads(tmp_path, capsys):
    folder = tmp_path / "from-report"
    assert cli_main(["view", str(REPORT), "--save", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "Nsight Systems report" in out and "GCNConv [backward]" in out
    assert {"run.json", "page.html", "trace.json.gz"} <= {p.name for p in folder.iterdir()}
    assert cli_main(["diff", str(folder), str(REPORT)]) == 0
    assert "propagate" in capsys.readouterr().out


def test_a_run_folders_flags_are_refused_for_a_run_folder(tmp_path, capsys):
    folder = tmp_path / "r"
    assert cli_main(["view", str(REPORT), "--save", str(folder)]) == 0
    capsys.readouterr()
    assert cli_main(["view", str(folder), "--warmup", "1"]) == 2
    err = capsys.readouterr().err
    assert "--warmup: Nsight Systems reports only" in err and "Traceback" not in err


def test_what_a_report_lacks_is_one_line(tmp_path, capsys):
    bad = tmp_path / "old.sqlite"
    shutil.copy(REPORT, bad)
    with sqlite3.connect(bad) as c:
        c.execute("ALTER TABLE NVTX_EVENTS DROP COLUMN category")
    with pytest.raises(ReportError, match="NVTX_EVENTS table has no column category"):
        read_report(bad)
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    assert cli_main(["view", str(empty)]) != 0
    err = capsys.readouterr().err
    assert "no NVTX_EVENTS table" in err and "Traceback" not in err and len(err.splitlines()) <= 3


def test_a_nsys_rep_without_nsys_says_how_to_export(tmp_path):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not read")
    env = dict(os.environ, PATH="/nonexistent", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "instrumented_convs", "view", str(rep)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    assert "needs the nsys command" in done.stderr and "nsys export --type sqlite" in done.stderr
    assert "Traceback" not in done.stderr


# -- reports built in nsys's schema (tests/nsys_reports.py): CUDA, threads, processes -------

US = 1000


def _cuda_report(path: Path, late: int) -> Path:
    """One process: an epoch region, a layer whose two kernels run ``late`` ns after the
    range ends (0: inside it), its backward on autograd's thread under ``backward``."""
    layer = RangeSpec(
        "GCNConv",
        10 * US,
        60 * US,
        scope="conv1",
        payload=0,
        launches=[
            Launch(12 * US, 14 * US, 20 * US + late, 30 * US + late),
            Launch(40 * US, 42 * US, 45 * US + late, 55 * US + late, kind="memcpy"),
        ],
    )
    main = [
        RangeSpec("epoch", 0, 200 * US, payload=1),
        layer,
        RangeSpec("backward", 100 * US, 190 * US, payload=1),
    ]
    auto = [
        RangeSpec(
            "GCNConv [backward]",
            110 * US,
            150 * US,
            scope="conv1",
            payload=0,
            launches=[Launch(112 * US, 113 * US, 120 * US, 250 * US)],
        )
    ]
    return build_report(path, [Proc(pid=7, threads={7: main, 8: auto})])


def test_device_times_come_from_the_work_each_range_launched(tmp_path):
    saved = read_report(_cuda_report(tmp_path / "cuda.sqlite", late=0))
    assert saved["report"]["device_times"] is True
    got = {(e["path"], e["phase"]): e for e in _entries(saved)}
    conv = got[("epoch/GCNConv", "forward")]
    assert conv["scope"] == "conv1" and conv["kind"] == "step"
    assert conv["total"] == 35 * US  # the span: first kernel's start to the copy's end
    assert conv["host"] == 50 * US and conv["dcalls"] == 1 and conv["busy"] == 20 * US
    assert conv["caught"] == 1 and conv["lag"] == 0
    back = got[("epoch/backward/GCNConv", "backward")]  # autograd's thread, under backward
    assert back["total"] == 130 * US and back["host"] == 40 * US
    assert back["lag"] == 100 * US and back["caught"] == 0  # its kernel ended 100 us after
    epoch = got[("epoch", "forward")]
    assert epoch["kind"] == "region" and epoch["dcalls"] == 1
    assert epoch["total"] == 230 * US  # all it holds: the layer's and the backward's work
    region = got[("epoch/backward", "forward")]  # its work is on autograd's thread
    assert region["total"] == 130 * US and region["host"] == 90 * US


def test_the_table_says_launch_bound_or_device_bound_from_a_report(tmp_path, capsys):
    assert cli_main(["view", str(_cuda_report(tmp_path / "a.sqlite", late=0))]) == 0
    out = capsys.readouterr().out
    assert "| Host |" in out.replace("  ", " ") or " Host " in out
    assert " Busy " in out and "Busy: the device's busy time" in out
    late = read_report(_cuda_report(tmp_path / "b.sqlite", late=400 * US))
    conv = next(e for e in _entries(late) if e["path"] == "epoch/GCNConv")
    assert conv["lag"] == 395 * US and conv["caught"] == 0  # the device far behind


def test_processes_in_one_report_merge_as_ranks_do(tmp_path):
    procs = [
        Proc(pid=pid, threads={pid: [RangeSpec("epoch", 0, n * US, payload=1)]})
        for pid, n in ((30, 10), (20, 30))
    ]
    saved = read_report(build_report(tmp_path / "two.sqlite", procs, cuda=False))
    assert saved["kind"] == "merged" and saved["world_size"] == 2
    assert [p["pid"] for p in saved["report"]["processes"]] == [20, 30]
    row = saved_summary(saved).rows[0]
    assert row.count == 2 and row.total == pytest.approx(40e-6)
    assert saved_summary(saved, rank=0).rows[0].total == pytest.approx(30e-6)


def test_ranges_without_our_domain_are_read_as_torch_pushes_them(tmp_path):
    spec = [RangeSpec("GCNConv", 0, 10 * US), RangeSpec("lin", 2 * US, 5 * US)]
    saved = read_report(
        build_report(tmp_path / "t.sqlite", [Proc(pid=5, threads={5: spec})], domain=False)
    )
    assert saved["report"]["domain"] is False
    assert [(e["path"], e["count"]) for e in _entries(saved)] == [
        ("GCNConv", 1),
        ("GCNConv/lin", 1),
    ]


@pytest.mark.parametrize("flag", ["--counters", "--memory", "--workers"])
def test_what_a_report_cannot_hold_is_one_line(flag, capsys):
    assert cli_main(["view", str(REPORT), flag]) == 2
    err = capsys.readouterr().err
    assert "an Nsight Systems report holds the steps' ranges" in err and "Traceback" not in err


def test_a_report_per_rank_merges_in_the_order_of_the_ranks_they_said(tmp_path, capsys):
    paths = []
    for rank, pid, n in ((1, 10, 30), (0, 90, 10)):  # rank 1 has the smaller pid
        mark = [(0, f"settings: record=all backward=True backward_every=1 rank={rank}")]
        spec = [RangeSpec("epoch", 5, 5 + n * US, payload=1)]
        procs = [Proc(pid=pid, threads={pid: spec}, marks=mark)]
        paths.append(str(build_report(tmp_path / f"rank{rank}.sqlite", procs, cuda=False)))
    assert cli_main(["view", *paths, "--rank", "0", "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["count"] == 1 and row["total"] == pytest.approx(10e-6)  # rank 0: pid 90
    assert cli_main(["view", *paths, "--format", "csv"]) == 0
    assert "epoch,epoch,0,,region,2," in capsys.readouterr().out
    assert cli_main(["view", paths[0], str(tmp_path)]) == 2
    assert "not an Nsight Systems report" in capsys.readouterr().err


# -- the ranges mode's switches -----------------------------------------------------------


def test_the_ranges_mode_puts_backward_every_back_as_it_found_it():
    import instrumented_convs as ic

    start = ic.configure()
    try:
        ic.configure(record="ranges")
        assert ic.configure().backward_every == 1
        with ic.configure(enabled=False):  # a block inside the mode keeps what to put back
            pass
        ic.configure(record="all")
        assert ic.configure().backward_every == start.backward_every
        ic.configure(record="ranges")
        ic.configure(backward_every=4)  # given meanwhile: kept
        ic.configure(record="all")
        assert ic.configure().backward_every == 4
        ic.configure(backward_every=16)
        ic.configure(counters=True)  # the counters and the ranges both want 1
        ic.configure(record="ranges")
        ic.configure(counters=False)
        assert ic.configure().backward_every == 1  # the ranges still on
        ic.configure(record="all")
        assert ic.configure().backward_every == 16
    finally:
        start.restore()


def test_every_push_says_the_layer_kind_and_clock_on_either_path(monkeypatch):
    """A step's first call takes Python's path (its entry is new), the later ones the C fast
    path: both push the entry's layer (a step inherits its layer's), the kind and the clock,
    which a report read back groups by."""
    events, _ = _three_calls(monkeypatch, training=True)
    pushed = [e[1:] for e in events if e[0] == "push"]
    by_name = {}
    for name, scope, region, cpu in pushed:
        by_name.setdefault(name, set()).add((scope, region, cpu))
    assert by_name["epoch"] == {(None, True, True)}
    scope = next(iter(by_name["GCNConv"]))[0]
    assert scope is not None and by_name["GCNConv"] == {(scope, False, True)}
    assert by_name["lin"] == {(scope, False, True)}  # three calls, one layer, one kind
    assert by_name["lin [backward]"] == {(scope, False, True)}
    assert sum(1 for p in pushed if p[0] == "lin") == 3
