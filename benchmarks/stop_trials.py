"""SIGTERM at random points of a training loop under ``run``, many times (tests/test_stopping.py
runs ten): each trial a fresh ``run`` of tests/scripts/long_pyg.py, the signal sent to the
process (even trials) or to its process group (odd ones: Slurm's way) a random 0 to
``--spread`` seconds after its second epoch was printed.

A trial holds where the job died by SIGTERM, its run folder is whole (run.json, summary.txt,
page.html, the trace, each readable), it says ``terminated`` and its GCNConv forward count is
the epochs printed (or one more: a step taken, its line not yet printed), its backward count
that or one less. Printed: the trials that held (the others, and why: a job that did not end
is sent SIGABRT, and its threads' stacks are shown), and the time from the signal to the
process's end (median, longest: what a scheduler's grace period must cover). A
traceback printed (SIGTERM's exception in a finalizer, say) fails the trial.

    python benchmarks/stop_trials.py                  # 100 trials
    python benchmarks/stop_trials.py --trials 10 --spread 1
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from instrumented_convs.commands.launch.runs import load, saved_summary  # noqa: E402
from instrumented_convs.report.timeline import read_trace  # noqa: E402

SCRIPT = str(ROOT / "tests" / "scripts" / "long_pyg.py")
WAIT = 120  # seconds a trial waits for the job's end after SIGTERM


def trial(number: int, delay: float, tmp: Path) -> Tuple[Optional[str], float]:
    """One trial: why it did not hold (None: it held), and the seconds from the signal to
    the process's end."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), DGLBACKEND="pytorch", PYTHONFAULTHANDLER="1")
    out = open(tmp / "job.out", "w+")
    err = open(tmp / "job.err", "w+")
    group = number % 2 == 1
    argv = [sys.executable, "-W", "ignore::UserWarning", "-m", "instrumented_convs", "run",
            "-o", "run", SCRIPT]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=out, stderr=err, start_new_session=group)
    try:
        end = time.monotonic() + 120
        while "epoch 1 " not in (tmp / "job.out").read_text():
            if time.monotonic() > end or proc.poll() is not None:
                return "no second epoch", 0.0
            time.sleep(0.02)
        time.sleep(delay)
        sent = time.monotonic()
        (os.killpg if group else os.kill)(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(WAIT)
        except subprocess.TimeoutExpired:  # its threads' stacks (faulthandler, on SIGABRT)
            proc.send_signal(signal.SIGABRT)
            proc.wait(30)
            stacks = (tmp / "job.err").read_text()[-3000:]
            return f"no end {WAIT} s after SIGTERM; its threads:\n{stacks}", WAIT
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = (tmp / "job.err").read_text()
    if code != -signal.SIGTERM:
        return f"exit code {code}: {said[-300:]}", took
    if "Traceback" in said or "Exception ignored" in said:  # SIGTERM's death prints nothing
        return f"a traceback printed: {said[-600:]}", took
    folder = tmp / "run"
    try:
        saved = load(folder)
        assert (folder / "summary.txt").read_text().strip(), "summary.txt empty"
        assert "</html>" in (folder / "page.html").read_text(), "page.html cut"
        assert read_trace(folder / "trace.json.gz")["traceEvents"], "no trace events"
    except Exception as e:  # noqa: BLE001 - the trial's finding
        return f"the folder: {type(e).__name__}: {e}", took
    printed = sum(line.startswith("epoch ") for line in (tmp / "job.out").read_text().split("\n"))
    counts = {(r.name, r.phase): r.count for r in saved_summary(saved)}
    trained = counts.get(("forward/GCNConv", "forward"), 0)
    backward = counts.get(("backward/GCNConv", "backward"), 0)
    if saved.get("ended_by") != "terminated" or not printed <= trained <= printed + 1:
        return f"ended_by {saved.get('ended_by')}, {trained} steps, {printed} printed", took
    if not trained - 1 <= backward <= trained:
        return f"{backward} backward steps for {trained} forward", took
    return None, took


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--spread", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=67)
    args = parser.parse_args(argv)
    draw = random.Random(args.seed)
    failed: List[str] = []
    took: List[float] = []
    with tempfile.TemporaryDirectory(prefix="stop-trials-") as root:
        for n in range(args.trials):
            tmp = Path(root) / str(n)
            tmp.mkdir()
            why, seconds = trial(n, draw.uniform(0, args.spread), tmp)
            took.append(seconds)
            if why is not None:
                failed.append(f"trial {n} ({'group' if n % 2 else 'process'}): {why}")
    held = args.trials - len(failed)
    print(
        f"{held} of {args.trials} trials held; from SIGTERM to the process's end: median "
        f"{statistics.median(took):.2f} s, longest {max(took):.2f} s"
    )
    for line in failed:
        print("  " + line)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
