"""Jobs under way for the tests of how ``run`` ends (tests/test_stopping.py,
tests/test_autosave.py): a child process forked where the server can (tests/forkserver.py),
its output in files, killed at the test's end if still running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from . import forkserver
from .helpers import ROOT, child_env

SCRIPT = str(ROOT / "tests" / "scripts" / "long_pyg.py")


class Job:
    """``python -W ignore::UserWarning ARGV`` under way, forked where the server can (see
    tests/forkserver.py), its output in files; ``session``: its own process group."""

    def __init__(self, tmp: Path, *argv: str, session: bool = False) -> None:
        env = child_env()
        argv = ("-W", "ignore::UserWarning", *argv)
        self.done: Optional[subprocess.CompletedProcess[str]] = None
        self.child = forkserver.start(argv, env, str(tmp), session=session)
        if self.child is not None:
            self.pid, self._out, self._err = self.child.pid, self.child.out, self.child.err
        else:
            self._out, self._err = str(tmp / "job.out"), str(tmp / "job.err")
            with open(self._out, "w") as out, open(self._err, "w") as err:
                self.proc = subprocess.Popen(
                    [sys.executable, *argv], cwd=tmp, env=env, stdout=out, stderr=err,
                    start_new_session=session,
                )  # fmt: skip
            self.pid = self.proc.pid

    def text(self, err: bool = False) -> str:
        if self.done is not None:
            return self.done.stderr if err else self.done.stdout
        with open(self._err if err else self._out) as f:
            return f.read()

    def until(self, seen, what: str, err: bool = False, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while not seen(self.text(err)):
            assert time.monotonic() < end, (
                f"no {what} in {timeout} s:\n{self.text()}{self.text(True)}"
            )
            time.sleep(0.02)

    def epochs(self) -> int:
        return sum(line.startswith("epoch ") for line in self.text().splitlines())

    def end(self) -> "subprocess.CompletedProcess[str]":
        if self.child is not None:
            self.done = self.child.wait(300)
        else:
            code = self.proc.wait(300)
            self.done = subprocess.CompletedProcess(
                self.proc.args, code, self.text(), self.text(True)
            )
        return self.done


#: The jobs under way: each test's are killed at its end if still running (a failed test must
#: not leave a job that trains forever).
_JOBS: List[Job] = []


def track(job: Job) -> Job:
    """Kill ``job`` at the test's end (:func:`end_jobs`) if it is still under way."""
    _JOBS.append(job)
    return job


def end_jobs() -> None:
    """Kill (SIGKILL) and reap every job still under way."""
    while _JOBS:
        job = _JOBS.pop()
        if job.done is None:
            try:
                os.kill(job.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            job.end()


def run_job(
    tmp: Path, *args: str, session: bool = False, flags: Sequence[str] = (), out: str = "run"
) -> Job:
    """``run FLAGS -o OUT`` of tests/scripts/long_pyg.py ``ARGS`` in ``tmp``, under way."""
    job = Job(tmp, "-m", "instrumented_convs", "run", *flags, "-o", out, SCRIPT, *args,
              session=session)  # fmt: skip
    return track(job)
