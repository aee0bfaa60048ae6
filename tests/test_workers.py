"""Data loaders' worker processes recorded (issue 42): real workers, fork and spawn,
persistent and not, torch's, PyG's and DGL's loaders; the batches they made against the
batches the loop took; a worker that raises or is killed; the split and its verdict."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from instrumented_convs import registry
from instrumented_convs.report import read_trace, workers_text
from instrumented_convs.report.workers import COMPUTE_BOUND, DATA_BOUND, pipeline, verdict
from instrumented_convs.testing import open_steps
from instrumented_convs.workers import frames

from .helpers import ROOT, run_script

SCRIPT = str(ROOT / "tests" / "scripts" / "loader_workers.py")
#: What the tool's bookkeeping of one call may add between two timings of it (clock readings,
#: a step's enter and exit): far more than it costs, far less than any batch's work.
READINGS_NS = 20_000
#: The script's torch loader, named where it is made
LABEL = "DataLoader at loader_workers.py:55"


def _run(*args: str, expect: int = 0) -> Tuple[List[str], Dict[str, Any]]:
    """The script's batch lines, and what it printed after them (RESULT, ROWS, OPEN)."""
    proc = run_script(SCRIPT, *args, expect=expect, timeout=300)
    batches = [line for line in proc.stdout.splitlines() if line.startswith("batch ")]
    out: Dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        key, _, rest = line.partition(" ")
        if key in ("RESULT", "ROWS", "OPEN"):
            out[key] = json.loads(rest)
    out["stderr"] = proc.stderr
    return batches, out


def _killed(err: str) -> bool:
    """Whether ``err`` says torch's error for a killed worker, whose words depend on when the
    loop noticed: the death reported by torch's SIGCHLD handler, or the batch it was handing
    over cut short (ConnectionResetError, EOFError...; printed by Python's last resort when
    it surfaced at exit, as on torch 2.2: "lost sys.stderr")."""
    return ("DataLoader worker (pid" in err and "is killed by signal" in err) or (
        re.search(r"\b(ConnectionResetError|EOFError|ConnectionRefusedError)\b", err) is not None
    )


def _steps(worker: Dict[str, Any]) -> Dict[str, int]:
    """A worker's rows: path -> count."""
    fields = worker["snapshot"]["fields"]
    path, count = fields.index("path"), fields.index("count")
    return {e[path]: e[count] for e in worker["snapshot"]["entries"]}


@pytest.mark.parametrize(
    "how",
    [
        ("--context", "fork"),
        ("--context", "spawn"),
        ("--context", "fork", "--persistent", "--prefetch", "4"),
        ("--context", "spawn", "--persistent", "--workers", "3"),
    ],
    ids=["fork", "spawn", "fork-persistent-prefetch4", "spawn-persistent-3"],
)
def test_every_batch_a_worker_made_is_one_the_loop_took_and_the_loop_sees_the_same(how):
    stock, _ = _run(*how)
    batches, got = _run(*how, "--library")
    assert batches == stock and len(batches) == 2 * 12  # two epochs of 48 items in 4s
    loaders, workers = got["RESULT"]["loaders"], got["RESULT"]["workers"]
    n = int(how[how.index("--workers") + 1]) if "--workers" in how else 2
    persistent = "--persistent" in how
    assert len(loaders) == 1 and loaders[0]["workers"] == n
    assert loaders[0]["consumed"] == 24 and loaders[0]["passes"] == 2
    # a process per worker and epoch, or one per worker for both epochs
    assert len(workers) == (n if persistent else 2 * n)
    assert sum(w["batches"] for w in workers) == loaders[0]["consumed"]
    assert all(w["failed"] == 0 for w in workers)
    assert {w["passes"] for w in workers} == {2 if persistent else 1}
    for w in workers:
        assert _steps(w) == {"batch": w["batches"]}
        assert len(w["spans"]) == w["batches"]
        assert all(t0 < t1 for _, _, t0, t1, _ in w["spans"])
        assert w["busy"] == sum(t1 - t0 for _, _, t0, t1, _ in w["spans"])
    assert got["ROWS"] == [["data", 24]] and got["OPEN"] == []


def test_a_worker_that_raises_raises_in_the_loop_as_stock_and_leaves_nothing_open():
    stock, out = _run("--raise", "13", expect=1)
    batches, got = _run("--raise", "13", "--library", expect=1)
    assert batches == stock
    assert "ValueError: item 13 is bad" in out["stderr"] and "ValueError: item 13" in got["stderr"]
    loader, workers = got["RESULT"]["loaders"][0], got["RESULT"]["workers"]
    assert sum(w["failed"] for w in workers) == 1  # the task that raised: made nothing
    assert loader["consumed"] == len(batches)
    assert sum(w["batches"] for w in workers) >= loader["consumed"]  # prefetched, not taken
    assert got["OPEN"] == []


def test_a_killed_worker_keeps_every_batch_it_had_recorded():
    whole, _ = _run()
    stock, out = _run("--kill", "13", expect=1)
    batches, got = _run("--kill", "13", "--library", expect=1)
    # how many batches the loop takes before torch sees the death is the machine's timing
    assert batches == whole[: len(batches)] and stock == whole[: len(stock)]
    for err in (out["stderr"], got["stderr"]):
        assert _killed(err), err[-2000:]
    loader, workers = got["RESULT"]["loaders"][0], got["RESULT"]["workers"]
    assert loader["consumed"] == len(batches)
    made = sum(w["batches"] for w in workers)
    assert made >= loader["consumed"] and all(len(w["spans"]) == w["batches"] for w in workers)
    assert got["OPEN"] == []


def test_a_loop_that_breaks_off_counts_what_it_took():
    batches, got = _run("--stop-after", "3", "--library")
    loader = got["RESULT"]["loaders"][0]
    assert len(batches) == 6 and loader["consumed"] == 6 and loader["passes"] == 0
    assert loader["span"] > 0


def test_pyg_dataloader_collates_in_the_workers():
    pytest.importorskip("torch_geometric")
    stock, _ = _run("--kind", "pyg")
    batches, got = _run("--kind", "pyg", "--library")
    assert batches == stock and len(batches) == 20
    workers = got["RESULT"]["workers"]
    assert sum(w["batches"] for w in workers) == 20
    for w in workers:
        assert _steps(w) == {"batch": w["batches"], "batch/collate": w["batches"]}


def test_dgl_samples_in_the_workers_and_slices_features_in_the_training_process():
    stock, _ = _run("--kind", "dgl", "--persistent")
    batches, got = _run("--kind", "dgl", "--persistent", "--library")
    assert batches == stock and len(batches) == 2 * 8  # 400 seeds in 50s, two epochs
    workers = got["RESULT"]["workers"]
    assert sum(w["batches"] for w in workers) == 16
    for w in workers:
        assert _steps(w) == {"batch": w["batches"], "batch/sample": w["batches"]}
    # DGL's prefetch copies the batch's blocks to the loader's device: a copy inside the wait
    assert got["ROWS"] == [["data", 16], ["data/features", 16], ["data/features/copy", 32]]


@pytest.mark.sparse
@pytest.mark.parametrize("per_worker", [True, False], ids=["filter-per-worker", "filter-here"])
def test_pyg_neighbor_loader_samples_in_the_workers_and_filters_where_it_is_told(per_worker):
    pytest.importorskip("torch_geometric")
    flag = () if per_worker else ("--no-filter-per-worker",)
    stock, _ = _run("--kind", "neighbor", *flag)
    batches, got = _run("--kind", "neighbor", "--library", *flag)
    assert batches == stock and len(batches) == 16
    workers = got["RESULT"]["workers"]
    assert sum(w["batches"] for w in workers) == 16
    for w in workers:
        want = {"batch": w["batches"], "batch/sample": w["batches"]}
        if per_worker:
            want["batch/filter"] = w["batches"]
        assert _steps(w) == want
    rows = [["data", 16]] + ([] if per_worker else [["data/filter", 16]])
    assert got["ROWS"] == rows


@pytest.mark.sparse
def test_pyg_link_neighbor_loader_samples_from_edges_in_the_workers():
    pytest.importorskip("torch_geometric")
    stock, _ = _run("--kind", "link")
    batches, got = _run("--kind", "link", "--library")
    assert batches == stock and len(batches) == 16  # 400 edges in 50s, two epochs
    for w in got["RESULT"]["workers"]:
        want = {"batch": w["batches"], "batch/sample": w["batches"], "batch/filter": w["batches"]}
        assert _steps(w) == want
    assert sum(w["batches"] for w in got["RESULT"]["workers"]) == 16


def test_run_saves_what_a_killed_workers_batches_recorded(tmp_path):
    out = tmp_path / "run"
    proc = run_script(
        "-m", "instrumented_convs", "run", "-o", str(out), SCRIPT, "--kill", "13", expect=1
    )
    assert _killed(proc.stderr), proc.stderr[-2000:]
    run = json.loads((out / "run.json").read_text())
    assert run["ended_by"] == "exception" and run["exit_code"] == 1
    loader, workers = run["workers"]["loaders"][0], run["workers"]["workers"]
    taken = sum(x.startswith("batch ") for x in proc.stdout.splitlines())
    # torch's SIGCHLD handler raises whenever the killed worker's signal arrives: also between
    # a batch handed over (consumed) and the loop's print of it (CI saw it once in several)
    assert taken <= loader["consumed"] <= taken + 1
    assert sum(w["batches"] for w in workers) >= loader["consumed"]
    assert all(len(w["spans"]) == w["batches"] for w in workers)


def test_frames_survive_a_write_cut_short(tmp_path):
    w = frames.Writer(tmp_path)
    for i in range(3):
        w.write({"i": i})
    w.close()
    path = next(frames.files(tmp_path))
    whole = path.read_bytes()
    path.write_bytes(whole[:-5])  # killed while writing the third frame
    assert frames.read(path) == [{"i": 0}, {"i": 1}]
    path.write_bytes(whole)
    assert frames.read(path) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert os.path.basename(path) == f"worker-{os.getpid()}{frames.SUFFIX}"


def _section(wait: int, span: int, busy: List[int]) -> Dict[str, Any]:
    snap = {"fields": ["name"], "entries": []}
    loader = dict(
        label="L #1", rank=None, workers=len(busy), consumed=10, wait=wait, span=span, first=10
    )
    workers = [  # a batch made before the first timed pass (t1 < first: not counted), one after
        dict(
            loader="L #1",
            rank=None,
            worker=i,
            pid=100 + i,
            batches=5,
            snapshot=snap,
            spans=[[0, 0, 0, 5, True], [1, 0, 10, 10 + b, True]],
        )
        for i, b in enumerate(busy)
    ]
    return {"loaders": [loader], "workers": workers}


def test_the_verdict_follows_the_share_of_each_iteration_spent_waiting():
    assert verdict(DATA_BOUND, [0.95, 0.9]).startswith("data-bound: the trainer waits 20%")
    assert "2 workers busy 92%" in verdict(0.62, [0.95, 0.9])
    assert verdict(COMPUTE_BOUND - 0.01, [0.3]).startswith("compute-bound")
    assert verdict(0.1, []).startswith("balanced")
    assert "no worker processes" in verdict(0.5, [])
    idle = verdict(0.3, [0.2, 0.1])
    assert idle.endswith(
        "the workers keep up; the wait is each batch's hand-over (its "
        "transfer from the worker) or this process's share of the loading"
    )
    here = verdict(0.3, [0.9], {"features": 0.1, "sample": 0.15})
    assert here.endswith(
        "most of the wait is the loader's work in this process (sample 15%, features 10%)"
    )
    (p,) = pipeline(_section(wait=62, span=100, busy=[95, 90]))
    assert p["wait"] == pytest.approx(0.62) and p["busy"] == [0.95, 0.9] and p["made"] == 10
    assert p["verdict"] == "data-bound: the trainer waits 62% of each iteration; 2 workers busy 92%"
    assert pipeline(_section(wait=0, span=0, busy=[])) == []  # nothing iterated: no line


def test_run_records_the_workers_of_an_unmodified_script_and_view_shows_each(tmp_path):
    out = tmp_path / "run"
    proc = run_script(
        "-m",
        "instrumented_convs",
        "run",
        "-o",
        str(out),
        SCRIPT,
        "--context",
        "spawn",
        "--persistent",
        timeout=300,
    )
    stock = run_script(SCRIPT, "--context", "spawn", "--persistent", timeout=300)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("batch ")]
    assert lines == [x for x in stock.stdout.splitlines() if x.startswith("batch ")]
    assert f"Loader {LABEL}: 24 batches taken, 24 made by 2 workers" in proc.stdout
    assert f"--- Loader {LABEL}: its workers, 2 workers merged" in proc.stdout
    run = json.loads((out / "run.json").read_text())
    section = run["workers"]
    assert [w["batches"] for w in section["workers"]] == [12, 12]
    assert section["loaders"][0]["consumed"] == 24
    view = run_script("-m", "instrumented_convs", "view", str(out), "--workers")
    assert (
        view.stdout.count("worker 0 (pid") == 1 and "12 batches, 0 failed, 2 passes" in view.stdout
    )
    assert view.stdout.startswith(workers_text(section).splitlines()[0])
    none = run_script("-m", "instrumented_convs", "view", str(out), "--workers", "--by", "layer")
    assert f"Loader {LABEL}: its workers" in none.stdout


def test_view_workers_of_a_run_without_loaders_says_so(tmp_path):
    out = tmp_path / "run"
    script = tmp_path / "s.py"
    script.write_text("print('no loader')\n")
    run_script("-m", "instrumented_convs", "run", "-o", str(out), str(script))
    proc = run_script("-m", "instrumented_convs", "view", str(out), "--workers", expect=1)
    assert "recorded no data loader" in proc.stderr


def test_the_recorder_leaves_torch_as_it_found_it():
    import torch.utils.data.dataloader as dl
    from torch.utils.data._utils import worker

    from instrumented_convs.workers import Recorder

    before = (
        worker._worker_loop,
        vars(dl.DataLoader)["__init__"],
        vars(dl.DataLoader)["_get_iterator"],
        vars(dl._BaseDataLoaderIter)["__next__"],
        vars(dl._MultiProcessingDataLoaderIter)["_process_data"],
    )
    r = Recorder().install()
    assert vars(dl._BaseDataLoaderIter)["__next__"] is not before[3]
    folder = Path(r.folder)
    r.close()
    after = (
        worker._worker_loop,
        vars(dl.DataLoader)["__init__"],
        vars(dl.DataLoader)["_get_iterator"],
        vars(dl._BaseDataLoaderIter)["__next__"],
        vars(dl._MultiProcessingDataLoaderIter)["_process_data"],
    )
    assert after == before and not folder.exists()


def test_the_runs_page_shows_each_loaders_split_and_the_timeline_each_worker(tmp_path):
    from .browser import body_data, count_colour, open_page, read_png, screenshot

    out = tmp_path / "run"
    run_script("-m", "instrumented_convs", "run", "--quiet", "-o", str(out), SCRIPT, "--persistent")
    section = json.loads((out / "run.json").read_text())["workers"]
    (p,) = pipeline(section)
    dom, console = open_page(out / "page.html")
    assert console == [] and body_data(dom)["errors"] == "0"
    assert "Data loaders: waiting for data against the rest" in dom and p["verdict"] in dom
    assert dom.count('class="worker"') == 2
    _, _, rows = read_png(screenshot(out / "page.html", tmp_path / "shot.png", (1000, 1400)))
    wait, rest = max(
        ((count_colour([r], "#e15759"), count_colour([r], "#4e79a7")) for r in rows), key=sum
    )
    assert wait + rest == pytest.approx(480, abs=3)  # the bar, 480 px wide
    assert wait / 480 == pytest.approx(p["wait"], abs=0.01)
    trace = read_trace(out / "trace.json.gz")
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    pids = {w["pid"] for w in section["workers"]}
    assert len(names) == 3 and sum(f"(pid {pid})" in " ".join(names) for pid in pids) == 2
    events = trace["traceEvents"]
    batches = [
        e for e in events if e.get("ph") == "X" and e["pid"] in pids and e["name"] == "batch"
    ]
    assert len(batches) == 24
    starts = [e for e in events if e.get("name") == "batch -> loop" and e["ph"] == "s"]
    ends = [e for e in events if e.get("name") == "batch -> loop" and e["ph"] == "f"]
    assert len(starts) == len(ends) == 24  # every batch taken has its arrow
    data = [
        e for e in events if e.get("ph") == "X" and e["name"] == "data" and e["pid"] not in pids
    ]
    for s, f in zip(sorted(starts, key=lambda e: e["id"]), sorted(ends, key=lambda e: e["id"])):
        made = [
            b for b in batches if b["pid"] == s["pid"] and b["ts"] <= s["ts"] <= b["ts"] + b["dur"]
        ]
        took = [d for d in data if d["ts"] <= f["ts"] <= d["ts"] + d["dur"]]
        near = sorted(
            batches + data, key=lambda e: min(abs(e["ts"] - s["ts"]), abs(e["ts"] - f["ts"]))
        )
        assert made and took, (s, f, near[:4], section["loaders"][0].get("taken"))
        assert made[0]["ts"] < took[0]["ts"] + took[0]["dur"]  # made before the loop had it


def test_under_torchrun_each_rank_records_its_workers_and_rank_0_merges_them(tmp_path):
    from .helpers import run_torchrun

    out = tmp_path / "ddp"
    proc = run_torchrun("-m", "instrumented_convs", "run", "-o", str(out), SCRIPT, "--persistent")
    run = json.loads((out / "run.json").read_text())
    section = run["workers"]
    assert sorted((x["rank"], x["consumed"]) for x in section["loaders"]) == [(0, 24), (1, 24)]
    assert sorted((w["rank"], w["worker"]) for w in section["workers"]) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    for rank in (0, 1):
        assert sum(w["batches"] for w in section["workers"] if w["rank"] == rank) == 24
    assert f"Loader {LABEL} (rank 0): 24 batches taken" in proc.stdout
    assert f"Loader {LABEL} (rank 1): 24 batches taken" in proc.stdout
    trace = read_trace(out / "trace.json.gz")
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    assert sum(n.startswith(f"rank 0, {LABEL}, worker") for n in names) == 2
    assert sum(n.startswith(f"rank 1, {LABEL}, worker") for n in names) == 2
    arrows = [e for e in trace["traceEvents"] if e.get("name") == "batch -> loop"]
    assert len(arrows) == 2 * 2 * 24 and len({e["id"] for e in arrows}) == 2 * 24


def test_run_times_each_batchs_copy_and_the_split_counts_it(tmp_path):
    pytest.importorskip("torch_geometric")
    train = str(ROOT / "tests" / "scripts" / "loader_training.py")
    out = tmp_path / "run"
    proc = run_script("-m", "instrumented_convs", "run", "-o", str(out), train, timeout=300)
    stock = run_script(train, timeout=300)
    losses = [x for x in stock.stdout.splitlines() if x.startswith("epoch ")]
    assert (
        len(losses) == 3
        and [x for x in proc.stdout.splitlines() if x.startswith("epoch ")] == losses
    )
    run = json.loads((out / "run.json").read_text())
    rows = {r["name"]: r for r in run["summary"]["rows"]}
    assert rows["copy"]["count"] == rows["data"]["count"] == 36  # 192 graphs in 16s, 3 epochs
    from instrumented_convs.commands.launch import saved_summary

    (p,) = pipeline(run["workers"], saved_summary(run))
    # the loader's copies, timed inside the region: the row's, less a few clock readings
    span = run["workers"]["loaders"][0]["span"]
    row = rows["copy"]["total"] * 1e9 / span
    assert row - 36 * READINGS_NS / span <= p["copy"] <= row
    assert 0 < p["copy"] < 1 and p["wait"] + p["copy"] + p["compute"] == pytest.approx(1.0)
    check = run_script("scripts/gpu_checks.py", "loaders", str(out))
    assert "36 batches taken, 36 made by 2 workers; 36 copies" in check.stdout


def test_a_copy_inside_the_wait_for_a_batch_is_waiting_already():
    from types import SimpleNamespace as Rows

    rows = [Rows(name=n, total=t) for n, t in (("data", 0.5), ("data/x/copy", 0.2), ("copy", 0.1))]
    summary = Rows(rows=rows)  # what pipeline reads of a summary: its rows' names and totals
    (p,) = pipeline(_section(wait=500_000_000, span=1_000_000_000, busy=[]), summary)
    assert p["wait"] == pytest.approx(0.5) and p["copy"] == pytest.approx(0.1)


def test_under_run_the_loaders_steps_are_there_when_the_script_imports_its_library_later(tmp_path):
    """``run`` patches DGL's loader module twice right after the script imports it: its
    iterator (the wait) and its feature slicing (a step): both must take."""
    out = tmp_path / "run"
    run_script(
        "-m", "instrumented_convs", "run", "--quiet", "-o", str(out), SCRIPT, "--kind", "dgl"
    )
    rows = {
        r["name"]: r["count"] for r in json.loads((out / "run.json").read_text())["summary"]["rows"]
    }
    assert rows["data"] == rows["data/features"] == 16


def test_two_patches_waiting_for_one_module_both_run_and_the_finder_leaves(tmp_path, monkeypatch):
    import sys

    from instrumented_convs.workers import imports

    (tmp_path / "ic_probe_module.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    stop_a = imports.patch_on_import(["ic_probe_module"], lambda m: seen.append(("a", m.X)))
    stop_b = imports.patch_on_import(["ic_probe_module"], lambda m: seen.append(("b", m.X)))
    assert imports.waiting()["ic_probe_module"] == 2 and imports.finder() is not None
    try:
        import ic_probe_module  # noqa: F401

        assert seen == [("a", 1), ("b", 1)]
    finally:
        stop_a()
        stop_b()
        sys.modules.pop("ic_probe_module", None)
    assert "ic_probe_module" not in imports.waiting() and imports.finder() is None


def test_a_worker_sends_each_timeline_call_once(monkeypatch):
    """A frame carries the calls made since the previous frame only (reading the whole
    timeline each batch made a long-lived worker's frames grow with its age)."""
    from instrumented_convs import configure, registry
    from instrumented_convs.core.storage import timeline as core_timeline
    from instrumented_convs.layers import step

    with configure(timeline=1000):
        registry.reset()
        for _ in range(3):
            with step("s"):
                pass
        calls, n = core_timeline.calls_since(0)
        assert n == 3 and [c[1] for c in calls] == ["s"] * 3
        with step("t"):
            pass
        calls, n = core_timeline.calls_since(n)
        assert n == 4 and [c[1] for c in calls] == ["t"]
        registry.reset()  # emptied: a reader that had taken 4 takes all again
        with step("u"):
            pass
        calls, n = core_timeline.calls_since(4)
        assert n == 1 and [c[1] for c in calls] == ["u"]
    registry.reset()


def test_a_batchs_span_lies_within_its_slice_on_the_timeline(tmp_path):
    """A batch's arrow leaves from the middle of its span, which must lie inside the batch's
    slice: read outside the region, a preemption between the region's close and the clock
    read (a busy machine) put the middle past the slice, and the arrow bound to nothing."""
    from instrumented_convs import configure, registry
    from instrumented_convs.workers import process

    with configure(timeline=1000):
        registry.reset()
        log = process._Log(process.Config(str(tmp_path), timeline=1000), 0, 1)
        for i in range(5):
            log.begin(i)
            log.end(i, None)
        log.writer.close()
        (path,) = frames.files(tmp_path)
        got = frames.read(path)
    registry.reset()
    spans = [f["span"] for f in got if f["span"]]
    calls = [c for f in got for c in f["calls"]]
    assert len(spans) == len(calls) == 5
    for (_, _, t0, t1, _), call in zip(spans, calls):
        assert call[5] <= t0 <= t1 <= call[6]


def test_the_pin_threads_calls_with_nothing_to_pin_are_no_step():
    """Measured on an H100 (2026-11-27): 40 ``pin memory`` calls for 36 batches, the pin
    thread's calls for the loader's control messages (their data None) among them."""
    from torch.utils.data._utils import pin_memory as pin

    from instrumented_convs import registry
    from instrumented_convs.workers import samplers

    remove = samplers.install()
    try:
        registry.reset()
        assert pin.pin_memory(None) is None
        assert pin.pin_memory("not a tensor") == "not a tensor"
        assert [(r.name, r.count) for r in registry.summary()] == [("pin memory", 1)]
    finally:
        remove()
        registry.reset()


def test_an_error_raised_at_any_point_of_the_wait_for_a_batch_leaves_nothing_open():
    """A signal's handler raises wherever the loop is (torch's, when a worker was killed): where
    Python looks for pending signals (a Python function's entry, a C call's return) in the
    recorder's and the package's code, an error raised at each such point in turn, alone or
    followed by a second one at the first bookkeeping call after it (the handler runs again, at
    each worker's end, while the first is handled), leaves no step open, no loader said to be
    waited for, and the next batch recorded as usual."""
    import torch

    from instrumented_convs.core.steps.step import Step
    from instrumented_convs.workers import Recorder, charge
    from instrumented_convs.workers import recorder as module

    class Interrupted(Exception):
        pass

    package = os.path.dirname(os.path.dirname(module.__file__))  # (its steps' code too)
    armed = [False]  # a second error at the next bookkeeping call (a profile that raised is off)
    real_waiting = charge.waiting

    def waiting(record):
        if armed[0]:
            armed[0] = False
            raise Interrupted("again")
        return real_waiting(record)

    def raising_at(k: int, again: bool):
        seen = [0]

        def profile(frame, event, arg):
            ours = frame.f_code.co_filename.startswith(package)
            if event == "call" and not ours:  # a Python call from the package's code
                back = frame.f_back
                ours = back is not None and back.f_code.co_filename.startswith(package)
            if ours and event in ("call", "c_return"):
                seen[0] += 1
                if seen[0] == k:
                    armed[0] = again
                    raise Interrupted(k)

        return profile, seen

    loader = torch.utils.data.DataLoader(list(range(1024)), batch_size=2)
    rec = Recorder(loaders=[loader], region=Step("data", None, "cpu", "region"), workers=False)
    rec.install()
    try:
        it = iter(loader)
        points, k = None, 1
        charge.waiting = waiting
        while points is None or k <= points:
            for again in (False, True):
                profile, seen = raising_at(k, again)
                sys.setprofile(profile)
                try:
                    next(it)
                except Interrupted:
                    pass
                finally:
                    sys.setprofile(None)
                    armed[0] = False
                if seen[0] < k:  # the call ran whole: every point an interrupted one may see
                    points = seen[0]
                assert open_steps() == [], (k, again)
                assert charge.state.waiting is None, (k, again)
                assert not getattr(rec._tls, "inside", False), (k, again)
                before = {r.name: r.count for r in registry.summary()}.get("data", 0)
                next(it)
                assert {r.name: r.count for r in registry.summary()}["data"] == before + 1, k
            k += 1
        assert points and points > 10  # the wait's calls were reached
    finally:
        charge.waiting = real_waiting
        rec.close()


def test_a_wait_that_raises_is_a_call_of_the_loader_as_of_its_data_row():
    """A loader whose batch raises (a dataset's error, a killed worker's): the wait before the
    error is a call of the ``data`` region and of the loader's record alike, so that the
    loader's waits add up to the ``data`` rows."""
    import torch

    from instrumented_convs.core.steps.step import Step
    from instrumented_convs.workers import Recorder

    class Bad(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            if i == 5:
                raise ValueError("item 5 is bad")
            return torch.tensor(float(i))

    loader = torch.utils.data.DataLoader(Bad(), batch_size=2)
    rec = Recorder(loaders=[loader], region=Step("data", None, "cpu", "region"), workers=False)
    rec.install()
    try:
        with pytest.raises(ValueError, match="item 5 is bad"):
            for _ in loader:
                pass
        (row,) = [r for r in registry.summary() if r.name == "data"]
        (seen,) = rec.result()["loaders"]
        assert (row.count, row.errors) == (3, 1)
        assert seen["calls"] == row.count and seen["batches"] == 3 and seen["consumed"] == 2
        assert 0 < seen["wait"] <= row.total * 1e9
    finally:
        rec.close()
