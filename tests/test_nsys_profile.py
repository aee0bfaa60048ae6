"""Under real Nsight Systems (skipped where ``nsys`` is not installed): what a run pushes
reads back through ``view REPORT`` as the table the process printed, the ranges mode
(``run --record ranges``) gives every call its range and records nothing, a backward timed
one call in N says which rows hold only some calls, and a reset (``run --warmup``) drops
what the process dropped.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Tuple

import pytest

from .helpers import ROOT, python_path

IMPORTER = "/usr/lib/nsight-systems/host-linux-x64/QdstrmImporter"
pytestmark = pytest.mark.skipif(shutil.which("nsys") is None, reason="needs nsys")
pytest.importorskip("torch_geometric")  # the scripts profiled are PyG's
CORA = [str(ROOT / "examples" / "cora.py"), "--platform", "pyg", "--quick", "--no-progress"]


#: A script that resets the registry between its calls.
RESETS = """
import torch
from instrumented_convs import registry
from instrumented_convs.pyg import GCNConv
conv = GCNConv(4, 4)
x, ei = torch.randn(10, 4), torch.randint(0, 10, (2, 30))
for n in (2, 3):
    registry.reset()
    for _ in range(n):
        conv(x, ei).sum().backward()
print(registry.summary().rows[0].count)
"""


SAMPLED = "import torch, instrumented_convs as ic; ic.configure(backward_every=2)"


def profiled(tmp: Path, *run_args: str, argv: Tuple[str, ...] = ()) -> Tuple[Path, Path]:
    """``python -m instrumented_convs run -o tmp/run RUN_ARGS`` (or ``python ARGV``) under
    ``nsys profile -t nvtx``: the report (.nsys-rep) and the run folder."""
    env = dict(os.environ, PYTHONPATH=python_path(), DGLBACKEND="pytorch", OMP_NUM_THREADS="1")
    out = tmp / "report"
    lock = os.path.join(tempfile.gettempdir(), "instrumented_convs-nsys.lock")  # nsys_check's
    cmd = ["flock", lock, "timeout", "300", "nsys", "profile", "-t", "nvtx", "--sample=none"]
    cmd += ["--cpuctxsw=none", "-f", "true", "-o", str(out), sys.executable]
    cmd += argv or ("-m", "instrumented_convs", "run", "-o", str(tmp / "run"), *run_args)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
    if proc.returncode != 0 and "Traceback" not in proc.stderr:  # nsys's own hiccup: once more
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = out.with_suffix(".nsys-rep")
    if not rep.exists():  # Debian's 2022.4 leaves the import to us
        qd = glob.glob(str(out) + ".qdstrm") or glob.glob(str(tmp / "*.qdstrm"))
        assert qd and os.path.exists(IMPORTER), proc.stdout + proc.stderr
        subprocess.run(["timeout", "300", IMPORTER, "-i", qd[0]], capture_output=True, check=True)
    assert rep.exists()
    return rep, tmp / "run"


def view(*args: str) -> "subprocess.CompletedProcess[str]":
    env = dict(os.environ, PYTHONPATH=python_path(), DGLBACKEND="pytorch")
    proc = subprocess.run(
        [sys.executable, "-m", "instrumented_convs", "view", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def rows(*args: str) -> Dict[Tuple[str, str], int]:
    """(path, phase) -> count of ``view ARGS --format json``."""
    data = json.loads(view(*args, "--format", "json").stdout)
    return {(r["name"], r["phase"]): r["count"] for r in data["rows"]}


def test_a_report_reads_back_as_the_table_the_run_saved(tmp_path):
    rep, run = profiled(tmp_path, "--warmup", "1", *CORA, "--epochs", "3")
    got = rows(str(rep))
    assert got == rows(str(run))
    assert (tmp_path / "report.sqlite").exists()  # exported beside the .nsys-rep
    assert rows(str(tmp_path / "report.sqlite")) == got


def test_a_reset_drops_what_ended_before_it(tmp_path):
    script = tmp_path / "resets.py"
    script.write_text(RESETS)
    rep, _ = profiled(tmp_path, argv=(str(script),))
    got = rows(str(rep))
    assert got[("GCNConv", "forward")] == 3 and got[("GCNConv", "backward")] == 3
    with sqlite3.connect(tmp_path / "report.sqlite") as c:
        pushed = c.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()[0]
    assert pushed > sum(got.values())  # the first two calls' ranges: in the report, dropped
    assert rows(str(tmp_path / "report.sqlite")) == got


def test_the_ranges_mode_pushes_every_call_and_records_nothing(tmp_path):
    rep, run = profiled(tmp_path, "--record", "ranges", "--backward-every", "4", *CORA)
    got = rows(str(rep))
    layer = "epoch/forward/forward/GCNConv"
    calls = got[(layer, "forward")]
    assert calls >= 6 and got[("epoch/backward/backward/GCNConv", "backward")] == calls
    assert got[("epoch/backward/backward/GCNConv/lin", "backward")] == calls
    assert "Partial" not in view(str(rep)).stdout
    saved = json.loads((run / "run.json").read_text())
    assert saved["summary"]["rows"] == []  # the process recorded nothing itself


def test_a_backward_timed_one_call_in_n_is_named_partial(tmp_path):
    script = tmp_path / "sampled.py"  # 20 calls: the first 2 timed, then one in 2 at random
    script.write_text(RESETS.replace("(2, 3)", "(20,)").replace("import torch", SAMPLED))
    rep, _ = profiled(tmp_path, argv=(str(script),))
    out = view(str(rep)).stdout
    partial = [line for line in out.splitlines() if line.startswith("Partial:")]
    assert len(partial) == 1 and "GCNConv [backward] " in partial[0], out[-2000:]
    assert " of 20" in partial[0]
    assert "backward_every=2" in partial[0]
