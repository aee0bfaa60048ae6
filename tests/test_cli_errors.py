"""The command line as a person meets it when something is wrong: every expected failure is a
line or two on stderr naming the file or flag, a non-zero exit code (2 for a usage error),
no traceback and no run folder when nothing ran; help that leads with examples and says
every default; one title for a run's table; install scripts that wait for apt's lock.
"""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs.commands.cli import main as cli_main

from .helpers import ROOT, run_script

#: A script with a model and an optimizer, no conv layer: quick under ``run``.
TINY = """\
import sys
import torch
model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


@pytest.fixture
def ours_logger():
    """The package's logger as it was: ``run`` gives it a handler of its own."""
    import logging

    logger = logging.getLogger("instrumented_convs")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    yield
    logger.handlers[:], logger.propagate = saved[0], saved[1]
    logger.setLevel(saved[2])


def _saved_run(folder, **meta):
    from instrumented_convs.commands.launch.runs import write_run

    ic.registry.reset()
    model = torch.nn.Linear(3, 2)
    with ic.region("epoch"):
        model(torch.randn(4, 3)).sum().backward()
    write_run(folder, ic.registry.snapshot(), {"exit_code": 0, **meta})
    ic.registry.reset()
    return folder


def _fails(capsys, argv, code):
    """Run the command ``argv`` in this process; its stderr, checked to be a failure a person
    can act on: the exit code ``code``, one or two lines, no traceback."""
    try:
        rc = cli_main(argv)
    except SystemExit as e:  # argparse's own errors exit
        rc = e.code
    err = capsys.readouterr().err
    assert rc == code, (rc, err)
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2, err
    assert "Traceback" not in err
    return err


# -- errors a person can act on -------------------------------------------------------------


def test_view_names_the_path_and_says_what_it_is(tmp_path, capsys):
    (tmp_path / "notrun").mkdir()
    (tmp_path / "notrun" / "readme.txt").write_text("hello")
    err = _fails(capsys, ["view", str(tmp_path / "notrun")], 1)
    assert "notrun" in err and "run.json" in err and "not a run folder" in err
    err = _fails(capsys, ["view", str(tmp_path / "missing")], 2)
    assert "missing" in err and "no such file or folder" in err
    (tmp_path / "notes.txt").write_text("just some text")
    err = _fails(capsys, ["view", str(tmp_path / "notes.txt")], 1)
    assert "notes.txt" in err and "not JSON" in err


def test_view_of_a_run_json_cut_short_says_the_run_may_be_incomplete(tmp_path, capsys):
    folder = _saved_run(tmp_path / "r")
    text = (folder / "run.json").read_text()
    (folder / "run.json").write_text(text[: len(text) // 2])
    err = _fails(capsys, ["view", str(folder)], 1)
    assert str(folder / "run.json") in err and "cut short" in err and "incomplete" in err


def test_a_folder_of_rank_files_says_to_merge_them(tmp_path, capsys):
    folder = _saved_run(tmp_path / "r")
    (folder / "run.json").rename(folder / "rank0.json")
    err = _fails(capsys, ["view", str(folder)], 1)
    assert "merge" in err


def test_a_rank_the_run_lacks_and_a_bad_flag_are_usage_errors(tmp_path, capsys):
    folder = _saved_run(tmp_path / "r")
    err = _fails(capsys, ["view", str(folder), "--rank", "3"], 2)
    assert "--rank 3" in err
    err = _fails(capsys, ["view", str(folder), "--by", "slowest"], 2)
    assert "--by" in err and "--help" in err
    err = _fails(capsys, ["run", "--bogus", "train.py"], 2)
    assert "--bogus" in err and " run" in err  # said by the command that was given it


def test_diff_and_merge_on_missing_or_wrong_folders(tmp_path, capsys):
    good = _saved_run(tmp_path / "good")
    (tmp_path / "notrun").mkdir()
    err = _fails(capsys, ["diff", str(good), str(tmp_path / "missing")], 2)
    assert "missing" in err
    err = _fails(capsys, ["diff", str(tmp_path / "notrun"), str(good)], 1)
    assert "notrun" in err
    err = _fails(capsys, ["merge", str(tmp_path / "missing")], 2)
    assert "missing" in err
    err = _fails(capsys, ["merge", str(tmp_path / "notrun")], 1)
    assert "rank" in err
    err = _fails(capsys, ["merge", str(good)], 1)
    assert "view" in err  # a run already: view it


def test_run_of_a_script_that_does_not_exist_runs_nothing_and_writes_nothing(
    tmp_path, capsys, monkeypatch, ours_logger
):
    monkeypatch.chdir(tmp_path)
    err = _fails(capsys, ["run", "nope.py"], 2)
    assert "nope.py" in err and "no such file" in err
    err = _fails(capsys, ["run", "-m", "nope_module_53"], 2)
    assert "nope_module_53" in err
    assert list(tmp_path.iterdir()) == []  # no ic-runs/ folder


def test_run_refuses_a_conv_class_that_does_not_exist_before_running(
    tmp_path, capsys, monkeypatch, ours_logger
):
    pytest.importorskip("torch_geometric")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("open('ran', 'w').close()\n")
    err = _fails(capsys, ["run", "--only", "GCNConvv", "s.py"], 2)
    assert "--only GCNConvv" in err and "GCNConv" in err.replace("GCNConvv", "")
    _fails(capsys, ["run", "--record-every", "0", "s.py"], 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]  # it never ran


def test_a_traceback_for_a_bug_report_on_asking(tmp_path, capsys, monkeypatch):
    from instrumented_convs.commands.errors import TRACEBACK_ENV, UserError

    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(UserError, match="no such file or folder"):
        cli_main(["view", str(tmp_path / "missing")])


def test_run_keeps_the_scripts_exit_code_and_one_title_everywhere(tmp_path):
    (tmp_path / "train.py").write_text(TINY)
    proc = run_script(
        "-m", "instrumented_convs", "run", "-o", "out", "train.py", "3", expect=3, cwd=tmp_path
    )
    title = "--- instrumented_convs run: train.py, exit code 3 "
    assert title in proc.stdout
    assert (tmp_path / "out" / "summary.txt").read_text().startswith(title)
    view = run_script("-m", "instrumented_convs", "view", "out", cwd=tmp_path)
    assert view.stdout.startswith(title)


def test_view_titles_an_older_run_as_run_did(tmp_path, capsys):
    saved = {"target": "train.py", "command": ["python", "train.py"], "ended_by": "returned"}
    folder = _saved_run(tmp_path / "r", **saved)
    data = json.loads((folder / "run.json").read_text())
    data.pop("title", None)  # saved before runs kept their title
    (folder / "run.json").write_text(json.dumps(data))
    assert cli_main(["view", str(folder)]) == 0
    assert capsys.readouterr().out.startswith("--- instrumented_convs run: train.py ")


# -- the install scripts wait for apt's lock ---------------------------------------------------


def test_every_apt_get_in_the_scripts_waits_for_the_lock():
    calls = [
        (path.name, line.strip())
        for path in sorted((ROOT / "scripts").glob("*.sh"))
        for line in path.read_text().splitlines()
        if re.search(r"\bapt-get\b", line) and not line.strip().startswith("#")
    ]
    assert calls, "no apt-get in scripts/*.sh"
    late = [(name, line) for name, line in calls if "DPkg::Lock::Timeout=" not in line]
    assert not late, f"apt-get calls that fail on a held lock rather than wait: {late}"
    for path in (ROOT / "scripts").glob("*.sh"):
        assert not re.search(r"^\s*apt (install|update)", path.read_text(), re.M), path.name


# -- help --------------------------------------------------------------------------------------


def _commands():
    """Every command's parser, built as the command line builds them."""
    from instrumented_convs.commands import check
    from instrumented_convs.commands.launch import cli as launch_cli
    from instrumented_convs.commands.study import cli as study_cli

    parser = argparse.ArgumentParser(prog="python -m instrumented_convs")
    sub = parser.add_subparsers(dest="command")
    study_cli.add_commands(sub)
    launch_cli.add_commands(sub)
    check.add_command(sub)
    return sub.choices


def test_every_commands_help_leads_with_examples_and_says_every_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    commands = _commands()
    assert set(commands) >= {"demo", "compare", "bench", "run", "view", "merge", "diff", "check"}
    for name, parser in commands.items():
        text = parser.format_help()
        for markup in ("``", ":func:", ":class:", ":mod:"):
            assert markup not in text, f"{name} --help shows reST ({markup})"
        head = text.splitlines()[:12]
        assert any(line.lower().startswith("example") for line in head), (
            f"{name} --help: no examples in its first 12 lines:\n" + "\n".join(head)
        )
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            flag = "/".join(action.option_strings) or action.dest
            assert action.help, f"{name} {flag} has no help"
            default = action.default
            if not action.option_strings or default is None or default is False:
                continue
            if isinstance(default, (list, tuple)) and not default:
                continue
            said = formatter._expand_help(action)
            assert "default" in said, f"{name} {flag}: its default {default!r} unsaid: {said}"


def test_compare_has_one_sparse_flag_and_takes_the_old_one(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    compare = _commands()["compare"]
    text = compare.format_help()
    assert "--with-sparse" in text and not re.search(r"--sparse\b", text)
    assert compare.parse_args(["--sparse"]).with_sparse is True
    assert compare.parse_args(["--with-sparse"]).with_sparse is True
