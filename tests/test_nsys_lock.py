"""scripts/nsys_locked.sh: one nsys session at a time, and an agent that outlives its session
neither holds the lock nor stays (a fake ``nsys`` on PATH leaves one, as the real one did)."""

from __future__ import annotations

import os
import subprocess
import time

from .helpers import ROOT

FAKE = """#!/usr/bin/env bash
# an nsys whose agent outlives the session, holding every inherited descriptor
(ls -l /proc/$BASHPID/fd > "$(dirname "$0")/fds"; exec -a "nsys --start-agent" sleep 120) &
echo "$$ $!" > "$(dirname "$0")/pids"
echo "profiled: $*"
"""


def test_a_leftover_agent_holds_no_lock_and_is_killed(tmp_path):
    fake = tmp_path / "nsys"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    script = str(ROOT / "scripts" / "nsys_locked.sh")
    proc = subprocess.run(
        ["bash", script, "60", "profile", "-t", "nvtx"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "profiled: profile -t nvtx\n", proc.stderr
    agent = int((tmp_path / "pids").read_text().split()[1])
    for _ in range(100):  # killed (a zombie until its parent, init, reaps it)
        try:
            with open(f"/proc/{agent}/status") as f:
                if "State:\tZ" in f.read():
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the agent left by the session is still running")
    # the agent never held the lock (flock's -o): a lost one would not hold later sessions
    assert "instrumented_convs-nsys.lock" not in (tmp_path / "fds").read_text()
