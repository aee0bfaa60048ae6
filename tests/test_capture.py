"""``run --on-demand`` and ``capture``: jobs running in processes of their own (an unmodified
PyG script, a torchrun job, a script of one's own on demand), captured while they run with the
command a user types; the job goes on, trains as without us, and ends as it would.

The in-process behaviour (the core's state, the writer, CUDA's events) is
``tests/test_ondemand.py``'s.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from instrumented_convs.commands.cli import main as cli_main
from instrumented_convs.report import Summary

from .helpers import ROOT, child_env, counts, stop_process

pytest.importorskip("torch_geometric")

SCRIPT = str(ROOT / "tests" / "scripts" / "long_pyg.py")
DDP = str(ROOT / "tests" / "scripts" / "plain_ddp.py")


def _env(**more: str) -> Dict[str, str]:
    return child_env(OMP_NUM_THREADS="1", **more)


class Job:
    """A command started in the background, its output read as it comes."""

    def __init__(self, *argv: str, cwd: Path, env: Optional[Dict[str, str]] = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-W", "ignore::UserWarning", *argv],
            cwd=cwd,
            env=env or _env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: List[str] = []
        self.err: List[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(s, lines), daemon=True)
            for s, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: List[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.out + self.err)

    def until(self, done, what: str, timeout: float = 180) -> None:
        """Wait until ``done()``; fail saying ``what`` with the output so far."""
        deadline = time.monotonic() + timeout
        while not done():
            assert self.proc.poll() is None, f"the job ended waiting for {what}:\n{self.text()}"
            assert time.monotonic() < deadline, f"no {what} in {timeout} s:\n{self.text()}"
            time.sleep(0.05)

    def epochs(self) -> List[str]:
        return [line for line in self.out if line.startswith(("epoch", "rank"))]

    def end(self, timeout: float = 120) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_process(self.proc)
            pytest.fail(f"the job did not end in {timeout} s:\n{self.text()}")
        for reader in self._readers:
            reader.join(timeout=10)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            stop_process(self.proc)


@pytest.fixture
def jobs():
    started: List[Job] = []
    yield started
    for job in started:
        job.kill()


def run_job(cwd: Path, *args: str, flags=("--on-demand",)) -> Job:
    """``run FLAGS -o run long_pyg.py ARGS`` in ``cwd`` (its folder: ``cwd/run``)."""
    return Job("-m", "instrumented_convs", "run", *flags, "-o", "run", SCRIPT, *args, cwd=cwd)


def capture(cwd: Path, *args: str, expect: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "instrumented_convs", "capture", *map(str, args)],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc


def listening(folder: Path, ranks: int = 0):
    names = ["listen.json"] if not ranks else [f"listen.rank{r}.json" for r in range(ranks)]
    return lambda: all((folder / n).exists() for n in names)


#: seconds in each unit the diff's table may use
UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def _same_step(shown: str, step: str) -> bool:
    """A step as the table shows it: whole, or cut with an ellipsis."""
    return shown == step or (shown.endswith("…") and step.startswith(shown[:-1]))


def _check_diff_table(text: str, a: Path, b: Path) -> None:
    """``diff A B``'s table: a row per step of the two captures (by its path, read from the
    tree's indentation), each with both means as the captures hold them (to the table's 3
    decimals) and the verdict the summaries' own diff gives."""
    unit = re.search(r"mean per call \(times in (\w+)\)", text).group(1)
    rows = list(Summary.load(a).diff(Summary.load(b)))
    shown, path = [], []
    for line in [line for line in text.splitlines() if line.count(" | ") == 6][1:]:
        cells = [c.strip() for c in line.split(" | ")]
        depth = (len(line) - len(line.lstrip(" "))) // 2
        step = cells[0][2:]
        phase = "backward" if step.endswith(" [backward]") else "forward"
        path[depth:] = [step.removesuffix(" [backward]")]
        shown.append((list(path), phase, cells))
    assert len(shown) == len(rows) > 10, text
    for steps, phase, cells in shown:
        (row,) = [
            r for r in rows if r.phase == phase and len(r.name.split("/")) == len(steps)
            and all(map(_same_step, steps, r.name.split("/")))
        ]  # fmt: skip
        for cell, side in zip(cells[1:3], (row.a, row.b)):
            if side is None:  # a step of one capture alone (an evaluation's)
                assert cell == "-", cells
            else:
                assert float(cell) == pytest.approx(side.mean * UNITS[unit], abs=6e-4), cells
        assert cells[-1] == row.verdict, (cells, row.verdict)


def test_a_job_is_captured_twice_while_it_runs_and_trains_as_without(tmp_path, jobs):
    run = tmp_path / "run"
    job = run_job(tmp_path)
    jobs.append(job)
    job.until(listening(run), "listen.json")
    job.until(lambda: len(job.epochs()) >= 3, "three epochs")
    folders = []
    for n in (5, 7):
        done = capture(tmp_path, run, "--iterations", n)
        folders.append(Path(done.stdout.strip()))
        assert folders[-1] == run / f"capture-{len(folders)}"
        assert job.proc.poll() is None  # the job goes on
    for folder, n in zip(folders, (5, 7)):
        saved = json.loads((folder / "run.json").read_text())
        first, last = saved["capture"]["first"], saved["capture"]["last"]
        assert last - first + 1 == n and saved["capture"]["complete"]
        c = counts(Summary.load(folder))
        for path in ("optimizer.step", "forward", "backward", "forward/GCNConv"):
            assert c[(path, "forward")] == n, (path, c)
        assert c[("backward/GCNConv", "backward")] == n
        evals = sum(1 for e in range(first - 1, last) if e % 5 == 0)  # epoch e's: iteration e+1
        assert c.get(("forward (no grad)", "forward"), 0) == evals
        assert (folder / "page.html").exists() and (folder / "trace.json.gz").exists()
        title = f"instrumented_convs {folder.name}: {SCRIPT}, iterations {first}-{last}"
        assert title in (folder / "summary.txt").read_text()
    seen = len(job.epochs())
    job.until(lambda: len(job.epochs()) > seen + 3, "epochs after the captures")
    diff = subprocess.run(
        [sys.executable, "-m", "instrumented_convs", "diff", *map(str, folders)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert diff.returncode == 0, diff.stderr
    _check_diff_table(diff.stdout, *folders)
    job.proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert job.end() == 130, job.text()
    saved = json.loads((run / "run.json").read_text())
    assert (saved["exit_code"], saved["ended_by"]) == (130, "interrupted")
    assert [Path(c["folder"]).name for c in saved["on_demand"]["captures"]] == [
        "capture-1",
        "capture-2",
    ]
    assert "On demand: nothing is recorded but what a capture asks for: 2 capture(s)" in (
        (run / "summary.txt").read_text()
    )
    assert not (run / "listen.json").exists()
    trained = job.epochs()[:-1]  # (the last: Ctrl-C may have come before its newline)
    plain = subprocess.run(
        [sys.executable, SCRIPT, "--epochs", str(len(trained))],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plain.stdout.splitlines()[: len(trained)] == trained  # bit for bit


def test_capture_says_what_it_cannot_do_and_leaves_other_processes_alone(tmp_path, jobs):
    stop = tmp_path / "stop"
    job = run_job(tmp_path, "--stop-file", str(stop), flags=())
    jobs.append(job)
    job.until(lambda: len(job.epochs()) >= 2, "two epochs")
    refused = capture(tmp_path, job.proc.pid, expect=1)
    assert f"process {job.proc.pid} (" in refused.stderr
    assert "does not listen for captures" in refused.stderr and refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1
    seen = len(job.epochs())
    job.until(lambda: len(job.epochs()) > seen + 2, "epochs after")
    stop.touch()
    assert job.end() == 0, job.text()  # untouched: it ends as it would
    assert "its job has ended" in capture(tmp_path, "run", expect=1).stderr
    assert "no such run folder or process id" in capture(tmp_path, "nowhere", expect=2).stderr


@pytest.fixture
def our_logger():
    """``run``'s command line sets our logger up its own way (a handler, no propagation):
    put it back for the tests after."""
    log = logging.getLogger("instrumented_convs")
    saved = (log.handlers[:], log.level, log.propagate)
    yield
    log.handlers[:], log.level, log.propagate = saved


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--record-every", "5"], "drop --record-every/--budget"),
        (["--budget", "0.01"], "drop --record-every/--budget"),
        (["--warmup", "2"], "drop --warmup"),
        (["--record", "ranges"], "--on-demand is --record on-demand"),
        (["--tensorboard", "tb"], "drop it"),
    ],
)
def test_run_refuses_on_demand_with_what_records_otherwise(
    tmp_path, capsys, flags, says, our_logger
):
    code = cli_main(["run", "--on-demand", *flags, "-o", str(tmp_path / "r"), SCRIPT])
    err = capsys.readouterr().err
    assert code == 2 and says in err, err
    assert not (tmp_path / "r").exists()


def test_one_under_way_is_refused_ctrl_c_cancels_and_the_jobs_end_cuts_one_short(tmp_path, jobs):
    stop = tmp_path / "stop"
    run = tmp_path / "run"
    job = run_job(tmp_path, "--sleep", "0.2", "--stop-file", str(stop))
    jobs.append(job)
    job.until(listening(run), "listen.json")
    long = Job("-m", "instrumented_convs", "capture", "run", "--iterations", "1000", cwd=tmp_path)
    jobs.append(long)
    job.until(lambda: any("capture-1 records" in line for line in job.err), "capture-1 begun")
    busy = capture(tmp_path, "run", "--iterations", 3, expect=1)
    assert "now: capture-1 is under way (" in busy.stderr, busy.stderr
    long.proc.send_signal(signal.SIGINT)  # Ctrl-C: the capture is cancelled
    assert long.end() == 130 and "cancelled, nothing written" in long.text()
    assert not (run / "capture-1").exists()  # the cancelled one: nothing, its folder gone
    late = capture(tmp_path, "run", "--iterations", 30, "--timeout", 1, expect=1)
    assert "--timeout 1: capture-1 is not written yet" in late.stderr, late.stderr
    assert "the job goes on and writes it in" in late.stderr
    job.until(lambda: (run / "capture-1" / "run.json").exists(), "capture-1 written after all")
    last = Job("-m", "instrumented_convs", "capture", "run", "--iterations", "1000", cwd=tmp_path)
    jobs.append(last)
    job.until(lambda: any("capture-2 records" in line for line in job.err), "capture-2 begun")
    time.sleep(1.0)
    stop.touch()
    assert job.end() == 0, job.text()
    assert last.end() == 1
    assert last.out == [str(run / "capture-2")], last.text()
    assert "of the 1000 iterations asked (the job ended)" in last.text()
    saved = json.loads((run / "capture-2" / "run.json").read_text())
    n = saved["capture"]["recorded"]
    assert n >= 1 and not saved["capture"]["complete"]
    assert counts(Summary.load(run / "capture-2"))[("optimizer.step", "forward")] == n


def test_a_capture_under_way_when_the_job_is_ended_is_written_and_capture_says_so(tmp_path, jobs):
    """SIGTERM (a scheduler's end) while a capture records: the job saves and dies by it, the
    capture is written as far as it got, and ``capture`` says why it is short."""
    run = tmp_path / "run"
    job = run_job(tmp_path, "--sleep", "0.05")
    jobs.append(job)
    job.until(listening(run), "listen.json")
    asked = Job("-m", "instrumented_convs", "capture", "run", "--iterations", "1000", cwd=tmp_path)
    jobs.append(asked)
    job.until(lambda: any("capture-1 records" in line for line in job.err), "capture-1 begun")
    time.sleep(0.5)
    job.proc.send_signal(signal.SIGTERM)
    assert job.end() == -signal.SIGTERM, job.text()
    assert asked.end() == 1 and asked.out == [str(run / "capture-1")], asked.text()
    assert "of the 1000 iterations asked (the job was ended (SIGTERM))" in asked.text()
    saved = json.loads((run / "capture-1" / "run.json").read_text())
    n = saved["capture"]["recorded"]
    assert n >= 1 and not saved["capture"]["complete"]
    assert counts(Summary.load(run / "capture-1"))[("optimizer.step", "forward")] == n
    job_run = json.loads((run / "run.json").read_text())
    assert job_run["ended_by"] == "terminated"
    assert [Path(c["folder"]).name for c in job_run["on_demand"]["captures"]] == ["capture-1"]


def test_torchrun_one_capture_reaches_every_rank_and_rank_0_merges(tmp_path, jobs):
    stop = tmp_path / "stop"
    run = tmp_path / "run"
    job = Job(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "instrumented_convs",
        "run",
        "--on-demand",
        "-o",
        str(run),
        DDP,
        "--stop-file",
        str(stop),
        "--sleep",
        "0.01",
        cwd=tmp_path,
    )
    jobs.append(job)
    job.until(listening(run, ranks=2), "both ranks listening", timeout=240)
    folder = Path(capture(tmp_path, run, "--iterations", 4).stdout.strip())
    by_agent = Path(capture(tmp_path, job.proc.pid, "--iterations", 3).stdout.strip())
    assert (folder.name, by_agent.name) == ("capture-1", "capture-2")
    for path, n in ((folder, 4), (by_agent, 3)):
        merged = Summary.load(path)
        assert merged.world_size == 2
        assert [counts(part)[("forward/GCNConv", "forward")] for part in merged.by_rank()] == [
            2 * n,
            2 * n,
        ]
        firsts = {
            json.loads((path / f"rank{r}.json").read_text())["capture"]["first"] for r in (0, 1)
        }
        assert len(firsts) == 1  # the same iterations on every rank
        assert (path / "trace.json.gz").exists() and (path / "page.html").exists()
    stop.touch()
    assert job.end(timeout=180) == 0, job.text()


def test_a_script_of_ones_own_is_on_demand_by_configure_or_the_environment(tmp_path, jobs):
    stop = tmp_path / "stop"
    own = Job(SCRIPT, "--ours", "--configure", "caps", "--stop-file", str(stop), cwd=tmp_path)
    env = _env(INSTRUMENTED_CONVS_RECORD="on-demand")
    by_env = Job(SCRIPT, "--ours", "--stop-file", str(stop), cwd=tmp_path, env=env)
    jobs.extend([own, by_env])
    own.until(listening(tmp_path / "caps"), "caps/listen.json")
    mine = Path(capture(tmp_path, "caps", "--iterations", 3).stdout.strip())
    assert mine == tmp_path / "caps" / "capture-1"
    by_env.until(lambda: list(tmp_path.glob("ic-runs/long_pyg-*/listen.json")), "ic-runs/")
    theirs = Path(capture(tmp_path, by_env.proc.pid, "--iterations", 2).stdout.strip())
    assert theirs.parent.parent == tmp_path / "ic-runs" and theirs.name == "capture-1"
    for folder, n in ((mine, 3), (theirs, 2)):
        c = counts(Summary.load(folder))
        assert c[("GCNConv", "forward")] == c[("SAGEConv", "forward")] >= n  # (evals too)
        assert c[("GCNConv", "backward")] == n
    stop.touch()
    assert own.end() == 0 and by_env.end() == 0
    assert not (tmp_path / "caps" / "listen.json").exists()  # taken back at exit


def test_run_on_demand_with_a_named_iteration_records_its_calls_only(tmp_path, jobs):
    stop = tmp_path / "stop"
    run = tmp_path / "run"
    flags = ("--on-demand", "--iteration", "epoch")
    job = run_job(tmp_path, "--region", "epoch", "--stop-file", str(stop), flags=flags)
    jobs.append(job)
    job.until(listening(run), "listen.json")
    folder = Path(capture(tmp_path, run, "--iterations", 3).stdout.strip())
    stop.touch()
    assert job.end() == 0, job.text()
    c = counts(Summary.load(folder))
    assert all(path.startswith("epoch") for path, _ in c), c  # no evaluation outside
    assert c[("epoch", "forward")] == 3 and c[("epoch/optimizer.step", "forward")] == 3


def test_what_capture_says_when_a_rank_missed_or_the_job_cut_it_short(tmp_path, caplog):
    """``capture``'s last words, from what each process answered (a torchrun job's rank
    that began past the start; a job that ended during it)."""
    import argparse

    from instrumented_convs.commands.errors import UserError
    from instrumented_convs.commands.launch.capture import _report

    folder = tmp_path / "capture-1"
    folder.mkdir()
    anns = [{"pid": 1}, {"pid": 2}]
    args = argparse.Namespace(iterations=20)
    whole = {"ok": True, "capture": {"complete": True, "recorded": 20}, "rank": 0}
    missed = {"ok": False, "error": "the job was at iteration 31 when it began", "rank": 1}
    with pytest.raises(UserError, match="was not written: the job was at iteration 31"):
        _report([whole, missed], anns, folder, args)  # (no merged run.json)
    (folder / "run.json").write_text("{}")
    assert _report([whole, missed], anns, folder, args) == 1
    assert "rank 1: the job was at iteration 31 when it began: merged without it" in caplog.text
    cut = {"ok": True, "capture": {"complete": False, "recorded": 7, "reason": "the job ended"}}
    assert _report([cut], anns[:1], folder, args) == 1
    assert "holds 7 of the 20 iterations asked (the job ended)" in caplog.text
    assert _report([whole], anns[:1], folder, args) == 0
    with pytest.raises(UserError, match=r"the job ended \(pid 2\) before"):
        _report([whole, None], anns, folder, args)
