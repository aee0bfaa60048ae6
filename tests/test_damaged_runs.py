"""Issue 67: a damaged run folder (run.json cut short, not JSON, edited by hand; its trace cut
or missing) gets one line from ``view`` and ``diff`` naming the file and what is wrong, exit
code 1, no traceback."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from .helpers import ROOT, run_script

pytest.importorskip("torch_geometric")

PLAIN = str(ROOT / "tests" / "scripts" / "plain_pyg.py")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A whole run folder, saved once (each test damages a copy)."""
    tmp = tmp_path_factory.mktemp("saved")
    run_script("-m", "instrumented_convs", "run", "--quiet", "-o", "run", PLAIN, "--epochs", "2",
               cwd=tmp)  # fmt: skip
    return tmp / "run"


def _said(tmp_path, *argv: str) -> str:
    """The one line a command says (exit code 1, no traceback)."""
    proc = run_script("-m", "instrumented_convs", *argv, cwd=tmp_path, expect=1)
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _edited(run: dict, how: str) -> dict:
    if how == "no snapshots":
        del run["snapshots"]
    elif how == "an entry short":
        run["snapshots"][0]["entries"][0] = run["snapshots"][0]["entries"][0][:2]
    elif how == "a count as text":
        fields = run["snapshots"][0]["fields"]
        run["snapshots"][0]["entries"][0][fields.index("count")] = "many"
    return run


@pytest.mark.parametrize("how", ["cut short", "not JSON", "no snapshots", "an entry short",
                                 "a count as text"])  # fmt: skip
def test_view_and_diff_name_a_damaged_run_json_in_one_line(saved, tmp_path, how):
    bad = tmp_path / "bad"
    shutil.copytree(saved, bad)
    text = (bad / "run.json").read_text()
    if how == "cut short":
        (bad / "run.json").write_text(text[: len(text) // 2])
    elif how == "not JSON":
        (bad / "run.json").write_text("summary: none\n")
    else:
        (bad / "run.json").write_text(json.dumps(_edited(json.loads(text), how)))
    line = _said(tmp_path, "view", "bad")
    assert line.startswith("view: bad/run.json ") or line.startswith(f"view: {bad}/run.json ")
    what = {
        "cut short": "is cut short or corrupt (it stops being JSON at line",
        "not JSON": "is not JSON at line 1, column 1: not a run",
    }.get(how, "is not a run as instrumented_convs saves it (")
    assert what in line, line
    diff = _said(tmp_path, "diff", str(saved), "bad")
    assert diff.startswith("diff: ") and what in diff, diff


def test_view_trace_names_a_trace_cut_short_or_missing(saved, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(saved, bad)
    data = (bad / "trace.json.gz").read_bytes()
    (bad / "trace.json.gz").write_bytes(data[: len(data) // 2])
    line = _said(tmp_path, "view", "bad", "--trace", "t.json")
    assert "bad/trace.json.gz is cut short or corrupt" in line, line
    assert line.endswith("the table is still there: python -m instrumented_convs view bad")
    (bad / "trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": ['))
    assert "is cut short or corrupt" in _said(tmp_path, "view", "bad", "--trace", "t.json")
    (bad / "trace.json.gz").unlink()
    line = _said(tmp_path, "view", "bad", "--trace", "t.json")
    assert "bad has no trace.json.gz: the run recorded no timeline" in line, line
    assert "GCNConv" in run_script("-m", "instrumented_convs", "view", "bad", cwd=tmp_path).stdout


def test_merge_names_a_rank_file_cut_short(tmp_path, monkeypatch):
    import instrumented_convs as ic
    from instrumented_convs.commands.launch.runs import write_run

    with ic.region("epoch"):
        pass
    folder = tmp_path / "job"
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        write_run(folder, ic.registry.snapshot(), {"exit_code": 0})
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    text = (folder / "rank1.json").read_text()
    (folder / "rank1.json").write_text(text[: len(text) // 3])
    line = _said(tmp_path, "merge", "job")
    assert line.startswith("merge: job/rank1.json is cut short or corrupt (") or line.startswith(
        f"merge: {folder}/rank1.json is cut short or corrupt ("
    ), line
    assert line.endswith("move it out of the folder to merge the others")
    (folder / "rank1.json").unlink()
    merged = run_script("-m", "instrumented_convs", "merge", "job", cwd=tmp_path)
    assert "merge: no file from ranks [1]: merged without them" in merged.stderr
