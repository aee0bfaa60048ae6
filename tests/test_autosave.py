"""Issue 67: ``run --autosave``. Real processes: SIGKILL after autosaves (the last one read
back, ``view`` and ``diff`` saying the job did not finish), a full disk and a read-only one
from a small tmpfs (a line each, the training going on, the next autosave written), and the
writer's thread in this process (nothing written after its stop)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from instrumented_convs.commands.launch.autosave import Autosave
from instrumented_convs.commands.launch.runs import load, saved_summary

from .helpers import counts, run_script
from .jobs import end_jobs, run_job

pytest.importorskip("torch_geometric")


@pytest.fixture(autouse=True)
def _no_job_left():
    yield
    end_jobs()


def _autosaved(path: Path, number: int = 1, steps: int = 0) -> dict:
    """The run.json at ``path`` once an autosave numbered ``number`` or later, of ``steps``
    optimizer steps or more, wrote it."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):  # (not there yet: os.replace makes it whole or absent)
        return {}
    auto = saved.get("autosave", {})
    return saved if auto.get("number", 0) >= number and auto.get("steps", 0) >= steps else {}


def test_a_killed_job_keeps_its_last_autosave_and_view_says_it_did_not_finish(tmp_path):
    job = run_job(tmp_path, flags=("--autosave", "0.5"))
    record = tmp_path / "run" / "run.json"
    job.until(lambda out: _autosaved(record, 3, steps=3), "a third autosave, 3 steps in")
    os.kill(job.pid, signal.SIGKILL)
    killed = time.time()
    proc = job.end()
    assert proc.returncode == -signal.SIGKILL
    saved = load(tmp_path / "run")
    auto = saved["autosave"]
    assert (saved["ended_by"], saved["exit_code"]) == ("running", None) and auto["number"] >= 3
    assert killed - auto["saved"] < 0.5 + 5  # one interval lost (and a busy machine's lag)
    assert saved["title"].endswith(", not finished (autosaved)")
    # its counts are one moment's: every optimizer step of it, forward and backward, and no
    # more epochs than the script printed by then (one more: its step was taken, not printed)
    moment = counts(saved_summary(saved))
    trained = moment[("forward/GCNConv", "forward")]
    assert 3 <= trained <= job.epochs() + 1
    assert trained - 1 <= moment[("backward/GCNConv", "backward")] <= trained
    assert not (tmp_path / "run" / "page.html").exists()  # (the page: at the end only)
    view = run_script("-m", "instrumented_convs", "view", "run", cwd=tmp_path)
    first = view.stdout.splitlines()[0]
    assert first.startswith("run: the job had not finished: its autosave of "), view.stdout
    assert f"after {auto['steps']} optimizer steps" in first and "GCNConv" in view.stdout
    as_json = run_script("-m", "instrumented_convs", "view", "run", "--json", cwd=tmp_path)
    assert json.loads(as_json.stdout)  # (the line on stderr: the JSON stays JSON)
    assert "the job had not finished" in as_json.stderr
    diff = run_script("-m", "instrumented_convs", "diff", "run", "run", cwd=tmp_path)
    assert [line.split(":")[1] for line in diff.stdout.splitlines()[:2]] == [
        " the job had not finished"
    ] * 2


def test_a_page_saved_before_a_scripts_handler_is_said_to_lag_behind_later_autosaves(tmp_path):
    """A script's own SIGTERM handler that lets the loop go on: the run is saved whole before
    it, autosaves go on; killed after one, the folder's page lags its run.json, and view says
    so."""
    job = run_job(tmp_path, "--sigterm-goes-on", flags=("--autosave", "0.3"))
    record = tmp_path / "run" / "run.json"
    job.until(lambda out: "epoch 1 " in out and _autosaved(record), "an epoch and an autosave")
    os.kill(job.pid, signal.SIGTERM)
    job.until(lambda out: "handler: going on" in out, "the script's handler")
    job.until(lambda out: _autosaved(record, 2), "an autosave after it")
    os.kill(job.pid, signal.SIGKILL)
    job.end()
    assert (tmp_path / "run" / "page.html").exists()  # (the save before the handler's)
    view = run_script("-m", "instrumented_convs", "view", "run", cwd=tmp_path)
    first = view.stdout.splitlines()[0]
    assert first.startswith("run: the job had not finished") and first.split("; ")[-1].startswith(
        "its page.html and summary.txt are of an earlier save ("
    ), first


def _mount(disk: Path, *options: str) -> None:
    subprocess.run(["mount", *options, "-t", "tmpfs", "tmpfs", str(disk)], check=True)


@pytest.fixture
def disk(tmp_path):
    """A 16 MiB tmpfs of its own (root only: mounting is the real full disk)."""
    if os.geteuid() != 0:
        pytest.skip("a tmpfs of its own needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount(disk, "-o", "size=16m")
    yield disk
    end_jobs()  # (no job holds it as it is unmounted)
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_and_a_read_only_one_are_said_once_and_the_training_goes_on(tmp_path, disk):
    job = run_job(tmp_path, "--stop-file", "stop", flags=("--autosave", "0.2"), out="disk/run")
    record = disk / "run" / "run.json"
    job.until(lambda out: _autosaved(record), "the first autosave")
    free = os.statvfs(disk)
    (disk / "filler").write_bytes(b"\0" * (free.f_bavail * free.f_frsize - 4096))
    line = "run/run.json not written (ENOSPC: No space left on device); the training goes on"
    job.until(lambda err: line in err, "the full disk's line", err=True)
    epochs = job.epochs()
    job.until(lambda out: job.epochs() > epochs + 10, "ten epochs more")
    time.sleep(1)  # five intervals more: said once
    assert job.text(err=True).count("not written") == 1
    (disk / "filler").unlink()
    job.until(lambda err: "run/run.json written again" in err, "the write again", err=True)
    number = _autosaved(record)["autosave"]["number"]
    _mount(disk, "-o", "remount,ro")
    line = "run/run.json not written (EROFS: Read-only file system)"
    job.until(lambda err: line in err, "the read-only disk's line", err=True)
    _mount(disk, "-o", "remount,rw")
    job.until(lambda out: _autosaved(record, number + 1), "an autosave after it")
    (tmp_path / "stop").touch()
    proc = job.end()
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("written again") == 2 and "Traceback" not in proc.stderr
    saved = load(disk / "run")
    assert saved["ended_by"] == "returned" and saved["autosave"]["saves"] > number
    assert counts(saved_summary(saved))[("forward/GCNConv", "forward")] == job.epochs()
    assert not [p.name for p in (disk / "run").iterdir() if p.name.endswith(".tmp")]


def test_nothing_is_written_after_stop_and_a_write_under_way_finishes_first(tmp_path):
    """In this process: the thread writes every interval; ``stop`` waits for a write under
    way (the lock), after which none is made, however late its record was."""
    path = tmp_path / "run.json"
    late = threading.Event()

    def make(number):
        if number == 3:
            late.set()
            time.sleep(0.3)  # (a record made while stop is called)
        return path, json.dumps({"number": number})

    auto = Autosave(0.01, make).start()
    assert late.wait(10)
    auto.stop()
    assert auto.saves == 2 and json.loads(path.read_text()) == {"number": 2}
    time.sleep(0.6)  # (the late record made: not written)
    assert auto.saves == 2 and not list(tmp_path.glob(".*"))
    assert Autosave(0, make).start()._thread is None  # (0: none)


def test_autosave_is_refused_where_nothing_would_be_saved(tmp_path):
    for flags, said in [
        (("--autosave", "-1"), "--autosave takes seconds >= 0"),
        (("--autosave", "5", "--on-demand"), "--autosave: on demand, each capture"),
        (("--autosave", "5", "--record", "ranges"), "--autosave: --record ranges records"),
    ]:
        proc = run_script("-m", "instrumented_convs", "run", *flags, "x.py", cwd=tmp_path, expect=2)
        assert said in proc.stderr and "Traceback" not in proc.stderr
