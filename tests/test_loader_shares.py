"""Each loader's share its own (issue 63): several loaders in one run, in sequence or nested,
made once or every epoch, with worker processes or not, PyG's and DGL's, under ``run`` of a
script nobody changed. Each loader's own work is recorded against it and never exceeds its
wait; the waits add up to the ``data`` rows, the loaders' own work to the rows inside them;
the loaders made at one place are one loader, named by where they were made."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest

from instrumented_convs.report.workers import pipeline
from instrumented_convs.workers.sites import labels

from .helpers import ROOT, run_script

SCRIPT = str(ROOT / "tests" / "scripts" / "loaders_many.py")
EPOCHS = 3  # the script's
#: What may lie between two timings of one call: the tool's bookkeeping (clock readings, a
#: step's enter and exit: microseconds), and on two busy cores (workers beside the loop) a
#: preemption in between: per call, and a share of the whole; far less than a batch's work.
READINGS_NS, SLACK = 20_000, 0.01
#: Each loader's own work, in the training process: PyG's DataLoader collates, DGL's samples
#: and slices the features.
OWN = {"pyg": {"collate"}, "dgl": {"sample", "features"}}

CASES = [
    ("pyg", 2, False, 0),
    ("pyg", 3, False, 0),
    ("pyg", 2, True, 0),
    ("pyg", 3, True, 2),
    ("dgl", 2, False, 0),
    ("dgl", 3, False, 2),
    ("dgl", 2, True, 0),
]


def _run(tmp_path: Path, platform: str, n: int, per_epoch: bool, workers: int) -> tuple:
    pytest.importorskip({"pyg": "torch_geometric", "dgl": "dgl"}[platform])
    args = ["--platform", platform, "--loaders", str(n), "--workers", str(workers)]
    args += ["--per-epoch"] if per_epoch else []
    stock = run_script(SCRIPT, *args, timeout=300)
    out = tmp_path / "run"
    proc = run_script("-m", "instrumented_convs", "run", "-o", str(out), SCRIPT, *args, timeout=300)
    losses = [x for x in stock.stdout.splitlines() if x.startswith("epoch ")]
    got = [x for x in proc.stdout.splitlines() if x.startswith("epoch ")]
    assert len(losses) == len(got) == EPOCHS
    if platform == "pyg":  # (DGL's sampling differs from one process to the next, seeded)
        assert got == losses
    return json.loads((out / "run.json").read_text()), proc.stdout


def _rows(run: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {r["name"]: r for r in run["summary"]["rows"]}


@pytest.mark.parametrize(
    "platform,n,per_epoch,workers",
    CASES,
    ids=[f"{p}-{n}-loaders{'-per-epoch' if e else ''}-workers{w}" for p, n, e, w in CASES],
)
def test_each_loader_has_its_own_share_and_the_waits_add_up(
    tmp_path, platform, n, per_epoch, workers
):
    run, text = _run(tmp_path, platform, n, per_epoch, workers)
    rows = _rows(run)
    loaders: List[Dict[str, Any]] = run["workers"]["loaders"]
    assert len(loaders) == n  # the per-epoch loader is one loader: made at one place
    trained = max(loaders, key=lambda x: x["loaders"])
    assert trained["loaders"] == (EPOCHS if per_epoch else 1)
    # named by where they were made: one line each, told apart, none numbered
    names = [x["label"] for x in loaders]
    assert len(set(names)) == n and all(
        re.fullmatch(r"\w+ at loaders_many\.py:\d+.*", s) for s in names
    )
    assert sum(line.startswith("Loader ") for line in text.splitlines()) == n

    # the waits add up to the data row, each within the readings around it
    data = rows["data"]
    calls = sum(x["batches"] for x in loaders)
    assert data["count"] == calls
    waits = sum(x["wait"] for x in loaders)
    assert data["total"] * 1e9 * (1 - SLACK) - calls * READINGS_NS <= waits <= data["total"] * 1e9

    # each loader's own work: inside its wait, and together the rows inside the data row
    for x in loaders:
        assert sum(x["own"].values()) <= x["wait"]
    for step in OWN[platform]:
        row = rows.get(f"data/{step}")
        own = sum(x["own"].get(step, 0) for x in loaders)
        if workers:  # made in the workers: in this process only DGL's features
            continue
        assert row is not None and own > 0
        assert abs(own - row["total"] * 1e9) <= row["count"] * READINGS_NS + SLACK * own
        assert all(x["own"].get(step, 0) > 0 for x in loaders)  # every loader did some

    # the split: each loader's parts at most its wait, all of it adding to one
    for p in pipeline(run["workers"]):
        assert sum(p["own"].values()) <= p["wait"] + 1e-9
        assert p["wait"] + p["copy"] + p["compute"] == pytest.approx(1.0)
        if workers:
            assert len(p["busy"]) == workers  # per worker, not per process


def test_loaders_made_by_one_helper_are_told_apart_by_where_it_was_called():
    sites = [
        ("DataLoader", ("a.py:5", "a.py:20", "a.py:40")),
        ("DataLoader", ("a.py:5", "a.py:21", "a.py:40")),
    ]
    sites.append(("DataLoader", ("b.py:9", "a.py:30")))
    sites.append(("NeighborLoader", ("a.py:5", "a.py:22")))
    assert labels(sites) == [
        "DataLoader at a.py:5 from line 20",
        "DataLoader at a.py:5 from line 21",
        "DataLoader at b.py:9",
        "NeighborLoader at a.py:5",
    ]
