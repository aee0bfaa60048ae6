"""Issue 67: a job ended by a signal keeps its run. Real processes, real signals: SIGTERM at
random points (to the process and to its group), a script's own SIGTERM handler, a second
and a third Ctrl-C while the run is saved."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from instrumented_convs.commands.launch.runs import load, saved_summary
from instrumented_convs.report.timeline import read_trace

from .helpers import ROOT, child_env, stop_process
from .jobs import Job, end_jobs, run_job, track

pytest.importorskip("torch_geometric")


@pytest.fixture(autouse=True)
def _no_job_left():
    yield
    end_jobs()


def _run(tmp: Path, *args: str, session: bool = False, flags=()) -> Job:
    return run_job(tmp, *args, session=session, flags=flags)


def _whole(folder: Path) -> dict:
    """The run folder read back as `view` reads it: every file there and readable."""
    saved = load(folder)
    assert (folder / "summary.txt").read_text().strip()
    assert "</html>" in (folder / "page.html").read_text()
    assert read_trace(folder / "trace.json.gz")["traceEvents"]
    return saved


def test_sigterm_at_random_points_saves_the_run_then_the_job_dies_by_it(tmp_path):
    """Ten trials, the even ones to the process, the odd ones to its process group (Slurm's
    way): every folder whole, its counts those of the epochs printed (or one more, where the
    signal came after an epoch's step and before its line)."""
    draw = random.Random(67)
    for trial in range(10):
        tmp = tmp_path / str(trial)
        tmp.mkdir()
        job = _run(tmp, session=trial % 2 == 1)
        job.until(lambda out: "epoch 1 " in out, "second epoch")
        time.sleep(draw.uniform(0, 0.3))
        if trial % 2:
            os.killpg(job.pid, signal.SIGTERM)
        else:
            os.kill(job.pid, signal.SIGTERM)
        proc = job.end()
        assert proc.returncode == -signal.SIGTERM, (trial, proc.stdout, proc.stderr)
        saved = _whole(tmp / "run")
        assert (saved["ended_by"], saved["exit_code"]) == ("terminated", 143)
        printed = job.epochs()
        counts = {(r.name, r.phase): r.count for r in saved_summary(saved)}
        trained = counts[("forward/GCNConv", "forward")]
        assert printed <= trained <= printed + 1, (trial, printed, counts)
        assert trained - 1 <= counts[("backward/GCNConv", "backward")] <= trained
        assert "Traceback" not in proc.stderr  # SIGTERM's death prints nothing


def test_a_scripts_own_sigterm_handler_is_kept_and_runs_after_the_run_is_saved(tmp_path):
    job = _run(tmp_path, "--stop-on-sigterm", "run")
    job.until(lambda out: "epoch 2 " in out, "third epoch")
    assert "handler installed: True" in job.text()  # signal.getsignal answers for it
    os.kill(job.pid, signal.SIGTERM)
    proc = job.end()
    # its handler ran after the save and stopped the loop; the job ended as it chose to
    assert proc.returncode == 0, proc.stderr
    assert "handler: SIGTERM, the run saved before: True" in proc.stdout
    assert "\ndone\n" in proc.stdout
    saved = _whole(tmp_path / "run")  # saved again at the end, over the first
    assert (saved["ended_by"], saved["exit_code"]) == ("returned", 0)


def test_a_second_ctrl_c_lets_the_save_finish_and_a_third_ends_at_once(tmp_path):
    """The save made long on purpose (--advise times changes first, for seconds), so that the
    signals land in it; two SIGINTs 50 ms apart: the save finished, exit 130."""
    flags = ("--advise", "--advise-seconds", "20")
    two = tmp_path / "two"
    two.mkdir()
    job = _run(two, flags=flags)
    job.until(lambda out: "epoch 1 " in out, "second epoch")
    os.kill(job.pid, signal.SIGINT)
    time.sleep(0.05)
    os.kill(job.pid, signal.SIGINT)
    proc = job.end()
    assert proc.returncode == 130, proc.stderr
    saved = _whole(two / "run")
    assert (saved["ended_by"], saved["exit_code"]) == ("interrupted", 130)
    three = tmp_path / "three"
    three.mkdir()
    job = _run(three, flags=flags)
    job.until(lambda out: "epoch 1 " in out, "second epoch")
    os.kill(job.pid, signal.SIGINT)
    job.until(lambda err: "KeyboardInterrupt" in err, "the script's end", err=True)
    os.kill(job.pid, signal.SIGINT)
    job.until(lambda err: "SIGINT while saving" in err, "the second's line", err=True)
    os.kill(job.pid, signal.SIGINT)
    proc = job.end()
    assert proc.returncode == -signal.SIGINT
    assert "run: ended by SIGINT before the run in run was written" in proc.stderr
    assert not (three / "run" / "run.json").exists()


def test_a_file_that_cannot_be_written_leaves_the_last_whole_one(tmp_path):
    """A run's page rewritten under RLIMIT_FSIZE (EFBIG, SIGXFSZ ignored), in a child: the
    error raised, the page as it was, no temporary file left."""
    from .helpers import run_script

    plain = str(ROOT / "tests" / "scripts" / "plain_pyg.py")
    run_script("-m", "instrumented_convs", "run", "--quiet", "-o", "run", plain, "--epochs", "1",
               cwd=tmp_path)  # fmt: skip
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    code = (
        "import errno, resource, signal\n"
        "from instrumented_convs.commands.launch.runs import load, saved_render_input, "
        "saved_summary\n"
        "from instrumented_convs.report import RENDERERS\n"
        "saved = load('run')\n"
        "inp = saved_render_input(saved, saved_summary(saved))\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
        "try:\n"
        "    RENDERERS['page'].write(inp, 'run/page.html')\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno])\n"
    )
    proc = run_script("-c", code, cwd=tmp_path)
    assert proc.stdout.strip() == "EFBIG"
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before


def test_a_process_the_script_forks_keeps_the_scripts_handlers_not_runs(tmp_path):
    """multiprocessing's terminate() sends SIGTERM: the forked child dies by it as without
    ``run`` (exit code -15, nothing printed), and `run` saves one run, the script's."""
    from .helpers import run_script

    (tmp_path / "forks.py").write_text(
        "import multiprocessing as mp, signal, time\n"
        "def sleep():\n"
        "    print('child handler is the default:',"
        " signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)\n"
        "    time.sleep(60)\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('fork').Process(target=sleep)\n"
        "    p.start()\n"
        "    time.sleep(1)\n"
        "    p.terminate()\n"
        "    p.join()\n"
        "    print('child exit code', p.exitcode)\n"
    )
    proc = run_script("-m", "instrumented_convs", "run", "-o", "run", "forks.py", cwd=tmp_path)
    assert "child handler is the default: True" in proc.stdout
    assert "child exit code -15" in proc.stdout and "Traceback" not in proc.stderr
    assert load(tmp_path / "run")["ended_by"] == "returned"


@pytest.mark.parametrize("hold", [None, 0])
def test_sigterm_to_torchruns_agent_saves_the_ranks_and_rank_0_merges_in_the_grace_period(
    tmp_path, hold
):
    """torchrun's agent sends SIGTERM on to its workers and kills them 30 s later: each rank
    saves its file, rank 0 merges within the bound; a rank held in a collective its peer left
    runs no Python until it is killed: it is merged from its autosave, and named (where it
    is rank 0, the other rank merges)."""
    script = str(ROOT / "tests" / "scripts" / "plain_ddp.py")
    folder = tmp_path / "ddp"
    cmd = [sys.executable, "-W", "ignore::UserWarning", "-m", "torch.distributed.run",
           "--standalone", "--nproc-per-node", "2", "-m", "instrumented_convs", "run",
           "--autosave", "0.5", "-o", str(folder), script]  # fmt: skip
    if hold is None:  # (ended at a random point of its steps)
        cmd += ["--stop-file", str(tmp_path / "no"), "--sleep", "0.02"]
    else:  # (rank 0 held in gloo, as where its peer left a collective)
        cmd += ["--steps", "3", "--hold", str(hold)]
    env = child_env(OMP_NUM_THREADS="1")
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=out, stderr=err, start_new_session=True
        )
    try:
        end = time.monotonic() + 180
        while not all(_steps(folder / f"rank{r}.json") >= 2 for r in (0, 1)) or (
            hold is not None and (tmp_path / "out").read_text().count("holds") < 2
        ):
            assert proc.poll() is None and time.monotonic() < end, (tmp_path / "err").read_text()
            time.sleep(0.1)
        sent = time.time()
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            stop_process(proc)  # (torchrun's workers are in sessions of their own)
    err = (tmp_path / "err").read_text()
    if hold is not None:  # (rank 0 runs again once rank 1 has left: it may merge again)
        assert "run: rank 0 merged nothing after SIGTERM (held?): rank 1 merges" in err, err
    # merged within torchrun's grace period (30 s, then SIGKILL: a rank held in gloo is killed)
    assert (folder / "run.json").stat().st_mtime - sent < 20, err
    merged = load(folder)
    assert merged["kind"] == "merged" and merged["ranks_missing"] == [], err
    ended = {r["rank"]: r["ended_by"] for r in merged["per_rank"]}
    held = [r for r, how in ended.items() if how == "running"]  # (merged from its autosave)
    assert sorted(ended) == [0, 1] and len(held) <= 1 and merged["ranks_unfinished"] == held
    assert hold is None or held in ([], [hold]), ended
    assert all(how == "terminated" for r, how in ended.items() if r not in held), ended
    parts = [{(r.name, r.phase): r.count for r in p} for p in saved_summary(merged).by_rank()]
    assert all(part[("forward/GCNConv", "forward")] >= 2 for part in parts), parts


def _steps(rank_file: Path) -> int:
    """The optimizer steps a rank's autosave holds (0 before one is written)."""
    try:
        return json.loads(rank_file.read_text())["autosave"]["steps"]
    except (OSError, ValueError, KeyError):
        return 0


def test_a_signal_whose_exception_the_script_swallowed_is_sent_again(tmp_path):
    """An exception raised where Python ignores it (a finalizer) or code that catches it all
    loses the signal: run sends it again each second while the script goes on."""
    (tmp_path / "swallows.py").write_text(
        "import time\n"
        "swallowed = []\n"
        "while True:\n"
        "    try:\n"
        "        print('tick', flush=True)\n"
        "        time.sleep(0.05)\n"
        "    except BaseException:\n"
        "        if swallowed:\n"
        "            raise\n"
        "        swallowed.append(1)\n"
        "        print('swallowed', flush=True)\n"
    )
    job = Job(tmp_path, "-m", "instrumented_convs", "run", "-o", "run", "swallows.py")
    track(job)
    job.until(lambda out: "tick" in out, "a tick")
    os.kill(job.pid, signal.SIGTERM)
    proc = job.end()
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "swallowed" in proc.stdout
    assert "the script went on after SIGTERM: sent again" in proc.stderr
    assert load(tmp_path / "run")["ended_by"] == "terminated"


def test_sigterm_inside_a_finalizer_prints_nothing_and_ends_the_job_at_once(tmp_path):
    """SIGTERM handled inside a ``__del__`` (where Python only prints an exception): no
    traceback, no warning, the signal sent again at once and the job dies by it."""
    (tmp_path / "finalizer.py").write_text(
        "import os, signal, time\n"
        "class Ends:\n"
        "    sent = False\n"
        "    def __del__(self):\n"
        "        if not Ends.sent:\n"
        "            Ends.sent = True\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "            for _ in range(1000):\n"
        "                pass\n"
        "while True:\n"
        "    Ends()\n"
        "    print('after', flush=True)\n"
        "    time.sleep(0.01)\n"
    )
    job = Job(tmp_path, "-m", "instrumented_convs", "run", "-o", "run", "finalizer.py")
    track(job)
    proc = job.end()
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr
    assert "sent again" not in proc.stderr, proc.stderr
    assert load(tmp_path / "run")["ended_by"] == "terminated"


def test_another_exception_in_a_finalizer_is_printed_as_without_run(tmp_path):
    """run's ``sys.unraisablehook`` keeps its own Terminated only: a script's finalizer that
    raises is printed as Python prints it, and the script goes on."""
    (tmp_path / "raises.py").write_text(
        "class Bad:\n"
        "    def __del__(self):\n"
        "        raise ValueError('mine')\n"
        "Bad()\n"
        "print('went on', flush=True)\n"
    )
    job = Job(tmp_path, "-m", "instrumented_convs", "run", "-o", "run", "raises.py")
    track(job)
    proc = job.end()
    assert proc.returncode == 0, proc.stderr
    assert "went on" in proc.stdout
    assert "Exception ignored in" in proc.stderr and "ValueError: mine" in proc.stderr
