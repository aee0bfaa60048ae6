"""``python -m instrumented_convs run``: unmodified PyG and DGL scripts, their runs, ``view`` and
``merge``; and the hooks it installs, in this process.

The scripts in tests/scripts import nothing of ours. Each run is checked for the script's own
behaviour (output, ``__name__``, ``sys.argv``, exit code, traceback), the regions and rows
with exact counts, and the files it leaves.
"""

from __future__ import annotations

import copy
import gzip
import importlib
import json
import os
import re
import sys
import time

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs.commands.cli import main as cli_main
from instrumented_convs.commands.launch.cli import typed_command
from instrumented_convs.commands.launch.hooks import Hooks
from instrumented_convs.report import Summary
from instrumented_convs.report.timeline import read_trace
from instrumented_convs.testing import open_steps

from .helpers import ROOT, assert_nested, counts, run_script, run_torchrun, spans

SCRIPTS = ROOT / "tests" / "scripts"


def run_cli(tmp_path, *args, expect=0):
    return run_script("-m", "instrumented_convs", *args, expect=expect, cwd=tmp_path)


def script_lines(text: str) -> list:
    return [line for line in text.splitlines() if line.startswith(("epoch", "batch", "__name__"))]


# -- unmodified scripts, in a child process --------------------------------------------------


def test_an_unmodified_pyg_script_is_profiled_and_trains_as_without(tmp_path):
    pytest.importorskip("torch_geometric")
    script = str(SCRIPTS / "plain_pyg.py")
    one = {"OMP_NUM_THREADS": "1"}  # the same sums in the same order, however loaded
    plain = run_script(script, "--epochs", "3", cwd=tmp_path, env=one)
    proc = run_script(
        "-m",
        "instrumented_convs",
        "run",
        "-o",
        "out",
        script,
        "--epochs",
        "3",
        cwd=tmp_path,
        env=one,
    )
    # The script's own output, losses to the last digit: it trained exactly as without us.
    assert script_lines(proc.stdout) == script_lines(plain.stdout)
    assert "__name__ __main__ argv ['--epochs', '3']" in proc.stdout
    assert "instrumented_convs run: " in proc.stdout  # the table, printed at the end

    summary = Summary.load(tmp_path / "out")
    c = counts(summary)
    # Training: Net and GAT each epoch (2 x 3), then GIN on 3 batches; evaluation apart.
    assert c[("forward", "forward")] == 9
    assert c[("forward (no grad)", "forward")] == 3
    assert c[("backward", "forward")] == 6
    assert c[("optimizer.step", "forward")] == 6
    assert c[("data", "forward")] == 3  # 6 graphs in batches of 2; the end is not a batch
    # Every conv built, however imported: torch_geometric.nn, .nn.conv, PyG's GAT model.
    assert c[("forward/GCNConv", "forward")] == 3
    assert c[("forward/SAGEConv", "forward")] == 3
    assert c[("forward/GATConv", "forward")] == 6
    assert c[("forward/GINConv", "forward")] == 3
    assert c[("forward (no grad)/GCNConv", "forward")] == 3
    assert ("forward/GCNConv/gcn_norm/add_remaining_self_loops", "forward") in c
    assert c[("backward/GCNConv", "backward")] == 3
    assert counts(Summary.load(tmp_path / "out" / "run.json")) == c  # the file, by its path

    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["format"] == "instrumented_convs.run" and run["version"] == 1
    assert run["exit_code"] == 0 and run["ended_by"] == "returned"
    assert run["args"] == ["--epochs", "3"] and run["command"][-3:] == [script, "--epochs", "3"]
    assert run["versions"]["torch"] == torch.__version__
    assert run["settings"]["enabled"] is True and run["settings"]["backward_every"] == 16
    # the title run printed: one title for the run's table wherever it is shown
    assert (
        (tmp_path / "out" / "summary.txt")
        .read_text()
        .startswith(f"--- instrumented_convs run: {script} ")
    )

    # The timeline: every call, nested per thread, arrows from forwards to their backward.
    trace = read_trace(tmp_path / "out" / "trace.json.gz")
    assert_nested(trace)
    x = spans(trace)
    on_timeline = {}
    for e in x:
        key = (e["args"]["path"], e["args"]["phase"])
        on_timeline[key] = on_timeline.get(key, 0) + 1
    assert on_timeline[("forward", "forward")] == 9 and on_timeline[("data", "forward")] == 3
    assert on_timeline[("forward/GCNConv", "forward")] == 3
    assert on_timeline[("backward/GCNConv", "backward")] == 3  # timed: the first 16 calls
    assert on_timeline[("backward", "forward")] == 6
    assert len(spans(trace, "s")) == len(spans(trace, "f")) >= 3 * 7
    # What each model and layer call was given, in its args (the graph: 144 nodes, 8 features).
    given = {}
    for e in x:
        if "inputs" in e["args"]:
            given.setdefault((e["name"], e["args"]["scope"]), e["args"]["inputs"])
    edges = given[("forward", None)][1]
    assert re.fullmatch(r"int64\[2, \d+\]", edges)
    assert given[("forward", None)] == ["float32[144, 8]", edges]
    assert given[("GCNConv", "conv1")] == ["float32[144, 8]", edges]
    assert given[("SAGEConv", "conv2")] == ["float32[144, 16]", edges]
    assert given[("GATConv", "convs.0")] == ["float32[144, 8]", edges, "edge_attr=None"]
    assert re.fullmatch(r"float32\[\d+, 8\]", given[("GINConv", "GINConv#0")][0])
    # regions (9 forward, 3 no grad), layers (4 a training step, 2 an evaluation, 3 GIN)
    assert sum("inputs" in e["args"] for e in x) == 9 + 3 + 3 * 4 + 3 * 2 + 3
    names = {e["args"]["name"] for e in spans(trace, "M") if "name" in e["args"]}  # not sort
    assert "main thread" in names and any(n.startswith("plain_pyg.py (") for n in names)
    assert run["trace"] == {
        "file": "trace.json.gz",
        "calls": len(x),
        "limit": 200_000,
        "truncated": False,
    }
    view = run_cli(tmp_path, "view", "out", "--trace", "copy.json")
    assert read_trace(tmp_path / "copy.json") == trace and "copy.json" in view.stdout

    # view: summarised again from the saved statistics, per layer instance.
    view = run_cli(tmp_path, "view", "out", "--by", "layer", "--depth", "1")
    for scope in ("conv1", "conv2", "convs.0", "convs.1"):
        assert f"| {scope} " in view.stdout
    assert "gcn_norm" not in view.stdout  # depth 1


#: What pip writes for a console script (setup.cfg's entry point).
CONSOLE_SCRIPT = """#!{python}
import re
import sys
from instrumented_convs.__main__ import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""


def test_the_run_folder_keeps_the_command_as_it_was_typed(tmp_path, monkeypatch):
    """Through the console script that PATH finds: ``instrumented-convs run ...``, not the
    path of an environment's python; ``python -m instrumented_convs run ...`` where PATH
    finds that python, else its path."""
    pytest.importorskip("torch_geometric")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "instrumented-convs"
    shim.write_text(CONSOLE_SCRIPT.format(python=sys.executable))
    shim.chmod(0o755)
    (tmp_path / "train.py").write_text((SCRIPTS / "plain_pyg.py").read_text())
    typed = ["run", "--quiet", "-o", "out", "train.py", "--epochs", "1"]
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    run_script(str(shim), *typed, cwd=tmp_path, env={"PATH": path})
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["command"] == ["instrumented-convs", *typed]
    page = (tmp_path / "out" / "page.html").read_text()
    assert '["command", "instrumented-convs run --quiet -o out train.py --epochs 1"]' in page

    # the console script where PATH does not find it: its path
    monkeypatch.setattr(sys, "argv", [str(shim), "run", "train.py"])
    monkeypatch.setenv("PATH", str(tmp_path))
    assert typed_command("train.py", []) == [str(shim), "run", "train.py"]
    # the module form: the python PATH finds by its name, else its path
    entry = str(ROOT / "instrumented_convs" / "__main__.py")
    monkeypatch.setattr(sys, "argv", [entry, "run", "x.py"])
    module = ["-m", "instrumented_convs", "run", "x.py"]
    assert typed_command("x.py", []) == [sys.executable, *module]
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    assert typed_command("x.py", []) == [os.path.basename(sys.executable), *module]
    # another program calling run's entry: the target and its arguments
    monkeypatch.setattr(sys, "argv", ["trainer", "--fast"])
    assert typed_command("x.py", ["--a"]) == ["x.py", "--a"]


def test_the_timeline_limit_cuts_it_and_zero_records_none(tmp_path):
    pytest.importorskip("torch_geometric")
    script = str(SCRIPTS / "plain_pyg.py")
    proc = run_cli(
        tmp_path, "run", "--quiet", "--trace-limit", "5", "-o", "cut", script, "--epochs", "1"
    )
    assert "kept its first 5 calls" in proc.stderr
    trace = read_trace(tmp_path / "cut" / "trace.json.gz")
    assert len(spans(trace)) == 5
    assert any("limit of 5 calls" in e["name"] for e in spans(trace, "i"))
    run_cli(tmp_path, "run", "--quiet", "--trace-limit", "0", "-o", "none", script, "--epochs", "1")
    assert not (tmp_path / "none" / "trace.json.gz").exists()
    assert "trace" not in json.loads((tmp_path / "none" / "run.json").read_text())
    view = run_cli(tmp_path, "view", "none", "--trace", "t.json", expect=1)
    assert "recorded no timeline" in view.stderr


@pytest.mark.parametrize(
    "end, code, how, says",
    [
        ("exit", 3, "exit", None),
        ("exit-msg", 1, "exit", "stopped on purpose"),
        ("raise", 1, "exception", "RuntimeError: failed on purpose"),
        ("interrupt", 130, "interrupted", "KeyboardInterrupt"),
    ],
)
def test_every_ending_gives_pythons_exit_code_and_saves_the_run(tmp_path, end, code, how, says):
    pytest.importorskip("torch_geometric")
    script = str(SCRIPTS / "plain_pyg.py")
    proc = run_cli(tmp_path, "run", "-o", "out", script, "--epochs", "1", "--end", end, expect=code)
    if says:
        assert says in proc.stderr
    if end == "raise":  # the traceback starts in the script, as python prints it
        traceback = proc.stderr.split("Traceback (most recent call last):")[1]
        frames = [line for line in traceback.splitlines() if line.startswith("  File ")]
        assert frames and all("plain_pyg.py" in f for f in frames), traceback
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert (run["exit_code"], run["ended_by"]) == (code, how)
    assert counts(Summary.load(tmp_path / "out"))[("forward", "forward")] == 2 + 3


def test_a_module_runs_as_python_m_and_default_folders_never_overwrite(tmp_path):
    pytest.importorskip("torch_geometric")
    proc = run_script(
        "-m",
        "instrumented_convs",
        "run",
        "--quiet",
        "-o",
        str(tmp_path / "m"),
        "-m",
        "plain_pyg",
        "--epochs",
        "1",
        cwd=SCRIPTS,
    )  # sys.path[0] is the current folder, as for python -m
    assert "__name__ __main__ argv ['--epochs', '1']" in proc.stdout
    assert "instrumented_convs run: " not in proc.stdout  # --quiet
    assert json.loads((tmp_path / "m" / "run.json").read_text())["module"] is True
    script = str(SCRIPTS / "plain_pyg.py")
    for _ in range(2):
        run_cli(tmp_path, "run", "--quiet", script, "--epochs", "1")
    folders = sorted((tmp_path / "ic-runs").iterdir())
    assert len(folders) == 2 and all(f.name.startswith("plain_pyg-") for f in folders)
    assert all((f / "run.json").exists() for f in folders)


def test_an_unmodified_dgl_script_with_its_dataloader(tmp_path):
    pytest.importorskip("dgl")
    script = str(SCRIPTS / "plain_dgl.py")
    one = {"OMP_NUM_THREADS": "1"}  # DGL's kernels: the same sums in the same order
    plain = run_script(script, "--epochs", "3", cwd=tmp_path, env=one)
    proc = run_script(
        "-m",
        "instrumented_convs",
        "run",
        "--warmup",
        "1",
        "-o",
        "out",
        script,
        "--epochs",
        "3",
        cwd=tmp_path,
        env=one,
    )
    assert script_lines(proc.stdout) == script_lines(plain.stdout)
    assert len(script_lines(plain.stdout)) == 3
    c = counts(Summary.load(tmp_path / "out"))
    # The first optimizer step (epoch 0's) is the warm-up: its forward is dropped, its eval not.
    assert c[("forward", "forward")] == 2 + 4  # 2 full-graph epochs, 4 sampled batches
    assert c[("forward (no grad)", "forward")] == 3
    assert c[("data", "forward")] == 4  # DGL's prefetching iterator, one region per batch
    assert c[("optimizer.step", "forward")] == 2 + 4
    assert c[("forward/GraphConv", "forward")] == 2 + 4
    assert c[("forward/SAGEConv", "forward")] == 2
    assert c[("backward/GraphConv", "backward")] == 2 + 4
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["warmup"] == {"steps": 1, "taken": 7}


def test_only_exclude_and_a_name_that_matches_nothing(tmp_path):
    pytest.importorskip("torch_geometric")
    script = str(SCRIPTS / "plain_pyg.py")
    proc = run_cli(
        tmp_path,
        "run",
        "-o",
        "out",
        "--only",
        "GCNConv,ChebConv",
        "--exclude",
        "GATConv",
        script,
        "--epochs",
        "1",
    )
    assert "--only ChebConv matched no conv layer" in proc.stderr
    c = counts(Summary.load(tmp_path / "out"))
    assert ("forward/GCNConv", "forward") in c
    assert not any(name.endswith(("SAGEConv", "GATConv", "GINConv")) for name, _ in c)


def test_torchrun_ranks_save_apart_and_rank_0_merges(tmp_path):
    pytest.importorskip("torch_geometric")
    script = str(SCRIPTS / "plain_ddp.py")
    run_torchrun("-m", "instrumented_convs", "run", "-o", str(tmp_path / "ddp"), script)
    folder = tmp_path / "ddp"
    assert {p.name for p in folder.iterdir()} >= {"rank0.json", "rank1.json", "run.json"}
    merged = Summary.load(folder)
    assert merged.world_size == 2
    c = counts(merged)
    assert c[("forward", "forward")] == 6 and c[("forward/GCNConv", "forward")] == 12
    assert c[("backward/GCNConv", "backward")] == 12
    assert [counts(part)[("forward", "forward")] for part in merged.by_rank()] == [3, 3]
    one = run_cli(tmp_path, "view", str(folder), "--rank", "1", "--json")
    assert Summary.from_json(one.stdout)["forward"].count == 3
    # One timeline of both ranks, a process each, on one time base.
    assert {"rank0.trace.json.gz", "rank1.trace.json.gz"} <= {p.name for p in folder.iterdir()}
    trace = read_trace(folder / "trace.json.gz")
    assert_nested(trace)
    procs = {e["pid"]: e["args"]["name"] for e in spans(trace, "M") if e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    forwards = [e for e in spans(trace) if e["name"] == "forward"]
    assert sorted(e["pid"] for e in forwards) == [0, 0, 0, 1, 1, 1]


def _rank_lines(text: str) -> list:
    """A DDP script's per-rank lines, sorted (two ranks print into one stream, interleaved)."""
    return sorted(re.findall(r"rank \d (?:step \d loss|acc|batch loss) [-+\d.e]+(?=\D|$)", text))


def test_torchrun_an_unmodified_dgl_ddp_script_in_the_default_folder(tmp_path):
    pytest.importorskip("dgl")
    script = str(SCRIPTS / "plain_dgl_ddp.py")
    plain = run_torchrun(script, cwd=tmp_path)
    proc = run_torchrun("-m", "instrumented_convs", "run", script, cwd=tmp_path)
    # Each rank trained exactly as without us: its losses to the last digit.
    assert len(_rank_lines(plain.stdout)) == 2 * (3 + 1 + 2)
    assert _rank_lines(proc.stdout) == _rank_lines(plain.stdout)
    (folder,) = (tmp_path / "ic-runs").iterdir()  # both ranks found the same default folder
    assert folder.name.startswith("plain_dgl_ddp-")
    files = {p.name for p in folder.iterdir()}
    assert files >= {
        "rank0.json",
        "rank1.json",
        "run.json",
        "summary.txt",
        "page.html",
        "rank0.trace.json.gz",
        "rank1.trace.json.gz",
        "trace.json.gz",
    }
    for rank in (0, 1):
        saved = json.loads((folder / f"rank{rank}.json").read_text())
        assert (saved["rank"], saved["world_size"], saved["exit_code"]) == (rank, 2, 0)
        assert saved["trace"]["file"] == f"rank{rank}.trace.json.gz"
    run = json.loads((folder / "run.json").read_text())
    assert run["trace"]["file"] == "trace.json.gz" and run["ranks_missing"] == []
    merged = Summary.load(folder)
    assert merged.world_size == 2
    c = counts(merged)
    # Per rank: 3 full-graph steps and 2 sampled batches (DDP around the model), an evaluation.
    assert c[("forward", "forward")] == 2 * 5 and c[("forward (no grad)", "forward")] == 2
    assert c[("backward", "forward")] == c[("optimizer.step", "forward")] == 2 * 5
    assert c[("data", "forward")] == 2 * 2  # DGL's loader with use_ddp: 2 batches a rank
    assert c[("forward/GraphConv", "forward")] == 2 * 5 * 2
    assert c[("forward (no grad)/GraphConv", "forward")] == 2 * 2
    assert c[("backward/GraphConv", "backward")] == 2 * 5 * 2
    for step in ("norm_src/degrees", "update_all"):  # (every call: full graph and block)
        assert c[(f"forward/GraphConv/{step}", "forward")] == 2 * 5 * 2, step
        assert c[(f"forward (no grad)/GraphConv/{step}", "forward")] == 2 * 2, step
    assert [counts(part)[("forward", "forward")] for part in merged.by_rank()] == [5, 5]
    # One timeline of both ranks, a process each; what each call was given in its args.
    trace = read_trace(folder / "trace.json.gz")
    assert_nested(trace)
    procs = {e["pid"]: e["args"]["name"] for e in spans(trace, "M") if e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}
    forwards = [e for e in spans(trace) if e["name"] == "forward"]
    assert sorted(e["pid"] for e in forwards) == [0] * 5 + [1] * 5
    graph = "DGLGraph(nodes 100, edges 500)"  # 400 edges and a self-loop per node
    assert all(e["args"]["inputs"][0] == graph for e in forwards[:3] + forwards[5:8])
    layers = [e for e in spans(trace) if e["name"] == "GraphConv" and e["cat"] == "forward"]
    assert all("inputs" in e["args"] for e in layers)
    assert {e["args"]["scope"] for e in layers} == {"conv1", "conv2"}
    assert any(e["args"]["inputs"][0].startswith("DGLBlock(nodes ") for e in layers)


def test_a_rank_that_never_ends_is_left_out_and_merge_merges_what_is_there(tmp_path):
    pytest.importorskip("torch_geometric")
    script = str(SCRIPTS / "plain_ddp.py")
    folder = tmp_path / "ddp"
    proc = run_torchrun(
        "-m",
        "instrumented_convs",
        "run",
        "--merge-timeout",
        "2",
        "-o",
        str(folder),
        script,
        "--vanish",
        "1",
    )
    assert "no file from ranks [1]" in proc.stderr
    assert not (folder / "rank1.json").exists()
    run = json.loads((folder / "run.json").read_text())
    assert run["ranks_missing"] == [1] and run["world_size"] == 2
    assert counts(Summary.load(folder))[("forward", "forward")] == 3
    (folder / "run.json").unlink()
    with pytest.raises(FileNotFoundError, match="merge"):
        Summary.load(folder)
    merged = run_cli(tmp_path, "merge", str(folder))
    assert "forward" in merged.stdout and (folder / "run.json").exists()


# -- the files a run leaves, in this process ---------------------------------------------------


def test_a_ranks_record_names_the_timeline_file_it_wrote(tmp_path, monkeypatch):
    from instrumented_convs.commands.launch.runs import load, merge_folder, write_run

    ic.configure(timeline=100)
    with ic.region("epoch"):
        pass
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    folder = tmp_path / "job"
    timeline = ic.registry.timeline()
    write_run(folder, ic.registry.snapshot(), {"exit_code": 0}, timeline=timeline, trace_name="r1")
    saved = load(folder / "rank1.json")["trace"]
    assert saved["file"] == "rank1.trace.json.gz" and (folder / saved["file"]).is_file()
    merged = merge_folder(folder)  # rank 0 never wrote: merged without it
    assert merged["ranks_missing"] == [0]
    assert merged["trace"] == {
        "file": "trace.json.gz",
        "calls": 1,
        "limit": 100,
        "truncated": False,
    }
    assert len(spans(read_trace(folder / merged["trace"]["file"]))) == 1
    assert [r["trace"] for r in merged["per_rank"]] == [saved]


def test_a_renderer_that_reads_the_timeline_writes_its_file_in_the_run_folder(
    tmp_path, monkeypatch
):
    """A run folder is written by asking every renderer with all that the run has (the
    summary, the timeline, the peaks, the loaders' records): one registered that reads the
    timeline finds it there and writes its file; without a timeline it writes none."""
    from instrumented_convs.commands.launch.runs import write_run
    from instrumented_convs.report import RENDERERS, Peak, Renderer, register

    seen = []

    class Calls(Renderer):
        name, file = "calls", "calls.txt"

        def wants(self, inp):
            return inp.timeline is not None

        def render(self, inp):
            seen.append((inp.peak, inp.loaders, inp.pid, inp.name))
            return f"{len(inp.timeline)} calls of {len(inp.summary.rows)} rows"

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ic.configure(timeline=100)
    with ic.region("epoch"):
        with ic.region("step"):
            pass
    loaders = {"loaders": [], "workers": []}
    meta = {"exit_code": 0, "peak": Peak(10.0, 20.0)._asdict(), "workers": loaders}
    register(Calls())
    try:
        for name, timeline in (("with", ic.registry.timeline()), ("without", None)):
            write_run(
                tmp_path / name, ic.registry.snapshot(), meta, timeline=timeline, trace_name="t"
            )
    finally:
        del RENDERERS["calls"]
    assert (tmp_path / "with" / "calls.txt").read_text() == "2 calls of 2 rows\n"
    assert seen == [(Peak(10.0, 20.0), loaders, os.getpid(), "t")]
    assert sorted(p.name for p in (tmp_path / "with").iterdir()) == [
        *("calls.txt", "page.html", "run.json", "summary.txt", "trace.json.gz")
    ]
    assert not (tmp_path / "without" / "calls.txt").exists()
    assert not (tmp_path / "without" / "trace.json.gz").exists()
    assert "calls" not in RENDERERS


def _job(monkeypatch, rank, agent):
    """Pretend to be ``rank`` of a 2-rank torchrun job whose agent is ``(pid, start)``."""
    from instrumented_convs.commands.launch import folders

    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(folders, "_agent", lambda: agent)


def test_default_folders_of_runs_started_in_the_same_second_are_distinct(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from instrumented_convs.commands.launch.runs import default_folder

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    started = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    root = str(tmp_path / "ic-runs")
    with ThreadPoolExecutor(6) as pool:  # runs that end at once, too
        made = list(pool.map(lambda _: default_folder("train.py", started, root=root), range(6)))
    assert sorted(f.name for f in made) == [f"train-{stamp}"] + [
        f"train-{stamp}-{n}" for n in range(2, 7)
    ]
    for f in made:  # what a run writes in its folder at once
        (f / "run.json").write_text("{}")
    # torchrun: the ranks of one job share a folder, another job started in the same second
    # gets its own, and neither takes the plain runs' folders.
    agent_start = started
    folders = {}
    for job, rank in (("a", 0), ("b", 0), ("a", 1), ("b", 1)):
        _job(monkeypatch, rank, (1000 + ord(job), agent_start))
        folders.setdefault(job, set()).add(default_folder("train.py", started, root=root))
    (a,), (b,) = folders["a"], folders["b"]
    assert a != b and not {a, b} & set(made)
    assert {a.name, b.name} == {f"train-{stamp}-7", f"train-{stamp}-8"}
    (a / "rank0.json").write_text("{}")  # a job's folder once its ranks wrote: still theirs
    _job(monkeypatch, 1, (1000 + ord("a"), agent_start))
    assert default_folder("train.py", started, root=root) == a


# -- reading runs ----------------------------------------------------------------------------


def _saved_run(tmp_path):
    model = torch.nn.Linear(3, 2)
    with ic.region("epoch"):
        model(torch.randn(4, 3)).sum().backward()
    from instrumented_convs.commands.launch.runs import write_run

    write_run(tmp_path / "r", ic.registry.snapshot(), {"exit_code": 0})
    return tmp_path / "r"


def test_summary_load_reads_folders_files_gzip_and_refuses_what_it_cannot(tmp_path):
    folder = _saved_run(tmp_path)
    summary = Summary.load(folder)
    assert summary == Summary.load(folder / "run.json") == ic.registry.summary()
    gz = tmp_path / "run.json.gz"
    gz.write_bytes(gzip.compress((folder / "run.json").read_bytes()))
    assert Summary.load(gz) == summary
    plain = tmp_path / "plain.json"
    plain.write_text(summary.to_json())
    assert Summary.load(plain) == summary
    newer = json.loads((folder / "run.json").read_text())
    newer["version"] = 99
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    with pytest.raises(ValueError, match="newer instrumented_convs"):
        Summary.load(tmp_path / "newer.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no run.json"):
        Summary.load(tmp_path / "empty")
    assert cli_main(["view", str(plain)]) == 1  # a line, no traceback (test_cli_errors.py)


def test_view_prints_the_selected_rows(tmp_path, capsys):
    folder = _saved_run(tmp_path)
    assert cli_main(["view", str(folder), "--unit", "us"]) == 0
    assert "(times in us)" in capsys.readouterr().out
    assert cli_main(["view", str(folder), "--rank", "1"]) == 2
    assert "this run has the ranks [0], not 1" in capsys.readouterr().err


def test_view_prints_any_renderer_by_name(tmp_path, capsys):
    from instrumented_convs.report import Summary

    folder = _saved_run(tmp_path)
    summary = Summary.load(folder)
    assert cli_main(["view", str(folder), "--format", "csv"]) == 0
    assert capsys.readouterr().out == summary.to_csv() + "\n"
    assert cli_main(["view", str(folder), "--format", "json"]) == 0
    assert Summary.from_json(capsys.readouterr().out) == summary
    assert cli_main(["view", str(folder), "--format", "page"]) == 0
    assert capsys.readouterr().out.startswith("<!DOCTYPE html>")


# -- the hooks, in this process --------------------------------------------------------------


@pytest.fixture
def hooks():
    installed = []

    def install(**kwargs):
        h = Hooks(**kwargs).install()
        installed.append(h)
        return h

    yield install
    for h in installed:
        h.close()
        h.remove()


def _gcn():
    torch_geometric = pytest.importorskip("torch_geometric")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch_geometric.nn.GCNConv(4, 8)
            self.conv2 = torch_geometric.nn.SAGEConv(8, 2)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    torch.manual_seed(0)
    x, edge_index = torch.randn(10, 4), torch.randint(0, 10, (2, 30))
    return Net(), x, edge_index


def test_instrumented_in_place_with_the_stock_outputs_gradients_and_state(hooks):
    model, x, edge_index = _gcn()
    stock = copy.deepcopy(model)
    ref = stock(x, edge_index)  # before the hooks: under them every model is instrumented
    ref.sum().backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before: must keep working
    hooks()
    out = model(x, edge_index)
    assert type(model.conv1) is importlib.import_module("instrumented_convs.pyg").GCNConv
    assert model.conv1.scope == "conv1" and model.conv2.scope == "conv2"
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    out.sum().backward()
    for (name, p), q in zip(model.named_parameters(), stock.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    opt.step()
    assert model.state_dict().keys() == stock.state_dict().keys()
    mine, its = list(model.parameters()), opt.param_groups[0]["params"]
    assert len(mine) == len(its) and all(a is b for a, b in zip(mine, its))  # the same ones
    c = counts(ic.registry.summary())
    assert c[("forward", "forward")] == 1 and c[("optimizer.step", "forward")] == 1
    assert c[("backward/GCNConv", "backward")] == 1


def test_layers_the_user_named_keep_their_names(hooks):
    model, x, edge_index = _gcn()
    ic.instrument(model.conv1, name=False).scope = "encoder"
    hooks()
    model(x, edge_index)
    assert model.conv1.scope == "encoder" and model.conv2.scope == "conv2"


def test_a_forward_that_raises_leaves_the_stacks_balanced_and_recording_on(hooks):
    model, x, edge_index = _gcn()
    bad = torch.randn(10, 5)  # the wrong number of features
    with pytest.raises(RuntimeError) as theirs:
        copy.deepcopy(model)(bad, edge_index)  # the stock model, before the hooks
    hooks()
    with pytest.raises(RuntimeError) as ours:
        model(bad, edge_index)
    assert str(ours.value) == str(theirs.value)
    assert open_steps() == []
    model(x, edge_index)
    assert ic.registry.summary()["forward"].errors == 1
    assert ic.registry.summary()["forward"].count == 2


def test_an_optimizer_step_that_raises_is_not_recorded_and_closes(hooks):
    class Flaky(torch.optim.SGD):
        fail = True

        def step(self, closure=None):
            if Flaky.fail:
                Flaky.fail = False
                raise RuntimeError("nan in the gradients")
            return super().step(closure)

    p = torch.nn.Parameter(torch.ones(2))
    opt = Flaky([p], lr=0.1)
    h = hooks(warmup=0)
    p.sum().backward()
    with pytest.raises(RuntimeError, match="nan"):
        opt.step()
    opt.step()  # the stale region is dropped here
    h.close()
    assert open_steps() == []
    assert ic.registry.summary()["optimizer.step"].count == 1 and h.steps == 1


def test_a_step_given_a_closure_has_its_forward_and_backward_beside_the_update(hooks):
    """Lightning (and LBFGS users) run forward and backward in the closure the optimizer
    calls first: they are the optimizer step's siblings, and ``optimizer.step`` is the
    update alone; an optimizer calling it again (LBFGS's line search) has them inside."""
    model, x, edge_index = _gcn()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    stock, stock_x = copy.deepcopy(model), x.clone()
    stock_opt = torch.optim.Adam(stock.parameters(), lr=0.01)

    def closure_of(m, o, inputs):
        def closure():
            o.zero_grad()
            loss = m(inputs, edge_index).square().mean()
            loss.backward()
            return loss

        return closure

    h = hooks()
    losses = [opt.step(closure_of(model, opt, x)) for _ in range(3)]
    h.close()
    h.remove()
    assert open_steps() == []
    c = counts(ic.registry.summary())
    assert c[("forward", "forward")] == 3 and c[("backward", "forward")] == 3
    assert c[("optimizer.step", "forward")] == 3 and h.steps == 3
    assert not [k for k in c if k[0].startswith("optimizer.step/")], sorted(c)
    ref = [stock_opt.step(closure_of(stock, stock_opt, stock_x)) for _ in range(3)]
    assert [t.item() for t in losses] == [t.item() for t in ref]
    ic.registry.reset()
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=3)
    h = hooks()
    lbfgs.step(closure_of(model, lbfgs, x))
    c = counts(ic.registry.summary())
    assert c[("forward", "forward")] == 1 and c[("optimizer.step", "forward")] == 1
    assert c[("optimizer.step/forward", "forward")] >= 1


def test_warmup_drops_what_the_first_steps_recorded(hooks):
    model, x, edge_index = _gcn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    h = hooks(warmup=2)
    for _ in range(5):
        opt.zero_grad()
        model(x, edge_index).sum().backward()
        opt.step()
    c = counts(ic.registry.summary())
    assert h.steps == 5
    assert c[("forward", "forward")] == 3 and c[("optimizer.step", "forward")] == 3


def test_data_loaders_one_region_per_batch_and_no_grad_apart(hooks):
    loader = torch.utils.data.DataLoader(list(range(5)), batch_size=2)
    model = torch.nn.Linear(1, 1)
    hooks()
    for _ in range(2):
        for batch in loader:
            model(batch.float()[:, None])
            with torch.no_grad():
                model(batch.float()[:, None])
    c = counts(ic.registry.summary())
    assert c[("data", "forward")] == 6
    assert c[("forward", "forward")] == c[("forward (no grad)", "forward")] == 6
    assert ic.registry.summary()["data"].errors == 0


def test_only_and_exclude_pick_classes_and_remove_puts_everything_back(hooks):
    model, x, edge_index = _gcn()
    call, backward = torch.nn.Module.__call__, torch.autograd.backward
    next_ = torch.utils.data.dataloader._BaseDataLoaderIter.__next__
    meta_path = list(sys.meta_path)
    h = hooks(only={"GCNConv", "GCNconv"}, exclude={"SAGEConv"})
    assert torch.nn.Module.__call__ is not call
    model(x, edge_index)
    assert type(model.conv1) is importlib.import_module("instrumented_convs.pyg").GCNConv
    assert type(model.conv2).__module__.startswith("torch_geometric")
    assert h.unmatched() == {"only": ["GCNconv"]}
    h.close()
    h.remove()
    assert torch.nn.Module.__call__ is call and torch.autograd.backward is backward
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__ is next_
    assert sys.meta_path == meta_path
    with pytest.raises(TypeError, match="collection"):
        ic.instrument(model, only="GCNConv")


def test_the_users_own_regions_still_nest(hooks):
    model, x, edge_index = _gcn()
    hooks()
    with ic.region("epoch"):
        model(x, edge_index).sum().backward()
    c = counts(ic.registry.summary())
    assert c[("epoch/forward", "forward")] == 1 and c[("epoch/backward", "forward")] == 1
    assert ("epoch/forward/GCNConv/gcn_norm", "forward") in c


def test_inputs_are_noted_when_they_change_and_every_call_shows_its_own(hooks):
    ic.configure(timeline=1000)
    model = torch.nn.Linear(2, 1)
    h = hooks()
    rows = [3, 3, 5, 5, 5, 3]
    for n in rows:
        model(torch.zeros(n, 2))
    tl = ic.registry.timeline()
    assert len(tl.notes) == 3  # 3 rows, 5 rows, 3 rows again: only where it changed
    forwards = sorted(
        (e for e in spans(tl.to_chrome()) if e["name"] == "forward"), key=lambda e: e["ts"]
    )
    assert [e["args"]["inputs"] for e in forwards] == [[f"float32[{n}, 2]"] for n in rows]
    # After a reset (the warm-up's end) the next call is noted again, though nothing changed.
    h.warmup, h.steps = 1, 0
    h._stepped()
    model(torch.zeros(3, 2))
    tl = ic.registry.timeline()
    assert len(tl.notes) == 1
    assert spans(tl.to_chrome())[0]["args"]["inputs"] == ["float32[3, 2]"]


_CHILD_SIGNALS = """
import os, signal, sys, threading, time

def handler(signum, frame):  # torch's data loader's, when a worker died
    raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")

signal.signal(signal.SIGCHLD, handler)

def script_running():
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if frame.f_code.co_filename == __file__:
            return True
        frame = frame.f_back
    return False

def keep_signalling():  # from when the script has ended
    while script_running():
        time.sleep(0.0005)
    end = time.monotonic() + 3
    while time.monotonic() < end:
        os.kill(os.getpid(), signal.SIGCHLD)
        time.sleep(0.0005)

threading.Thread(target=keep_signalling, daemon=True).start()
raise ValueError("the loop broke")
"""


def test_a_sigchld_handler_that_raises_after_the_script_ended_does_not_lose_the_run(tmp_path):
    """torch's SIGCHLD handler raises whenever a killed worker's signal arrives, also once
    the script has ended: the run is saved all the same and the exit code is the script's."""
    script = tmp_path / "signals.py"
    script.write_text(_CHILD_SIGNALS)
    proc = run_cli(tmp_path, "run", "-o", "out", str(script), expect=1)
    assert "ValueError: the loop broke" in proc.stderr
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert (run["exit_code"], run["ended_by"]) == (1, "exception")
