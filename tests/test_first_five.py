"""What a new user meets first (issue 53): the console command, exports to a path, switches
that check their types, and an empty table that says why it is empty."""

from __future__ import annotations

import configparser
import importlib
import json
from pathlib import Path

import pytest

import instrumented_convs as ic
from instrumented_convs import region, registry
from instrumented_convs.core.settings import Switches
from instrumented_convs.layers import step
from instrumented_convs.report import Summary

from .helpers import ROOT, integration


def _recorded(clock) -> Summary:
    """A summary of one region with one step inside (exact times)."""
    with region("forward"):
        with step("GCNConv"):
            clock.advance(3_000)
        clock.advance(1_000)
    return registry.summary()


# -- the console command -------------------------------------------------------------------
def _console_script() -> str:
    """The target setup.cfg declares for the ``instrumented-convs`` command."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg.get("options.entry_points", "console_scripts").strip().splitlines()
    scripts = dict(line.replace(" ", "").split("=", 1) for line in lines)
    return scripts["instrumented-convs"]


@pytest.mark.parametrize("argv", [[], ["run"], ["view"], ["check"], ["diff"]])
def test_the_console_command_is_declared_and_runs_each_command(argv, capsys):
    """``instrumented-convs`` is a console script whose target runs every command."""
    module, name = _console_script().split(":")
    main = getattr(importlib.import_module(module), name)
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out


# -- exports with a path -------------------------------------------------------------------
def test_to_csv_and_to_json_write_to_a_path_and_return_none(clock, tmp_path):
    """Given a path (str or PathLike) they write the text there, as pandas does."""
    s = _recorded(clock)
    for path in (tmp_path / "out.csv", str(tmp_path / "again.csv")):
        assert s.to_csv(path) is None
        assert Path(path).read_text(encoding="utf-8") == s.to_csv()
    assert s.to_json(tmp_path / "out.json") is None
    assert Summary.from_json((tmp_path / "out.json").read_text(encoding="utf-8")) == s
    assert s.to_json(str(tmp_path / "flat.json"), indent=None) is None
    assert (tmp_path / "flat.json").read_text(encoding="utf-8") == s.to_json(indent=None)
    assert json.loads(s.to_json())["rows"] and "\n" not in s.to_json(indent=None)


def test_to_json_takes_indent_as_a_keyword_only(clock):
    """A number where the path goes is refused, not written nor used as the indent."""
    s = _recorded(clock)
    with pytest.raises(TypeError, match="indent"):
        s.to_json(4)


def test_to_html_writes_to_a_keyword_path_its_title_first(clock, tmp_path):
    """``to_html(title, path=...)`` writes the page; the diff's page does the same."""
    s = _recorded(clock)
    assert s.to_html("my run", path=tmp_path / "page.html") is None
    assert (tmp_path / "page.html").read_text(encoding="utf-8") == s.to_html("my run")
    assert "my run" in s.to_html("my run")
    change = s.diff(s)
    assert change.to_html(path=str(tmp_path / "diff.html")) is None
    assert (tmp_path / "diff.html").read_text(encoding="utf-8") == change.to_html()


# -- switches check their types --------------------------------------------------------------
@pytest.mark.parametrize(
    "switches, named, wanted",
    [
        (dict(enabled="false"), "enabled", "True or False"),
        (dict(backward="no"), "backward", "True or False"),
        (dict(enabled=0), "enabled", "True or False"),
        (dict(counters="yes"), "counters", "True or False"),
        (dict(record_every="10"), "record_every", "whole number"),
        (dict(backward_every=2.5), "backward_every", "whole number"),
        (dict(timeline=True), "timeline", "whole number"),
        (dict(budget="0.01"), "budget", "fraction"),
        (dict(iteration=3), "iteration", "string"),
        (dict(enabled=False, record_function="off"), "record_function", "True or False"),
    ],
)
def test_configure_refuses_a_switch_of_the_wrong_type_and_changes_nothing(switches, named, wanted):
    """TypeError naming the switch and what it takes; every switch stays as it was."""
    before = ic.configure()
    with pytest.raises(TypeError) as refused:
        ic.configure(**switches)
    assert named in str(refused.value) and wanted in str(refused.value)
    assert ic.configure() == before


def test_configure_still_refuses_values_out_of_range_and_bad_nvtx_words():
    """Right type, wrong value: ValueError, as before (``nvtx="yes"`` among them)."""
    before = ic.configure()
    for switches, named in ((dict(nvtx="yes"), "nvtx"), (dict(record_every=0), "record_every")):
        with pytest.raises(ValueError, match=named):
            ic.configure(**switches)
    assert ic.configure() == before
    with ic.configure(enabled=False, backward_every=4):  # the right types pass
        assert ic.configure().enabled is False and ic.configure().backward_every == 4


def test_environment_words_are_parsed_and_other_words_refused(monkeypatch):
    """``off``, ``Yes``... read as before; a word of neither kind names the variable."""
    monkeypatch.setenv("INSTRUMENTED_CONVS_BACKWARD", "Off")
    assert Switches().backward is False
    monkeypatch.setenv("INSTRUMENTED_CONVS_BACKWARD", " yes ")
    assert Switches().backward is True
    monkeypatch.setenv("INSTRUMENTED_CONVS_DISABLE", "maybe")
    with pytest.raises(ValueError, match="INSTRUMENTED_CONVS_DISABLE.*'maybe'"):
        Switches()


def test_conv_profiler_refuses_switches_of_the_wrong_type_at_once():
    """``ConvProfiler(...)`` checks its switches and numbers when made, not at ``fit``."""
    integration("lightning")
    from instrumented_convs.lightning import ConvProfiler

    before = ic.configure()
    for switches, named in (
        (dict(enabled="false"), "enabled"),
        (dict(record_every="10"), "record_every"),
        (dict(backward_every=2.5), "backward_every"),
        (dict(counters=1), "counters"),
        (dict(warmup="3"), "warmup"),
        (dict(timeline=1.5), "timeline"),
    ):
        with pytest.raises(TypeError, match=f"ConvProfiler: {named}"):
            ConvProfiler(**switches)
    with pytest.raises(ValueError, match="record_every"):
        ConvProfiler(record_every=0)
    assert ic.configure() == before


def test_the_magics_bad_flags_are_refused_before_the_cell_runs(capsys):
    """A flag's text that is not a number it takes: argparse's error line, nothing run."""
    integration("IPython")
    from instrumented_convs.notebook import InstrumentedMagics

    class Shell:
        """What the magic uses of IPython's shell."""

        user_ns: dict = {}
        ran: list = []

        def run_cell(self, cell: str) -> None:
            self.ran.append(cell)

    shell = Shell()
    magics = InstrumentedMagics(shell=shell)
    before = ic.configure()
    for flags, named in (
        ("--record-every 0", "--record-every"),
        ("--record-every ten", "--record-every"),
        ("--budget 2", "--budget"),
        ("--backward-every 1.5", "--backward-every"),
        ("--record-every 4 --budget 0.1", "--budget"),
    ):
        assert magics.instrumented(flags, "x = 1") is None
        assert named in capsys.readouterr().err
    assert shell.ran == [] and ic.configure() == before


# -- an empty table says why -----------------------------------------------------------------
def test_an_empty_table_says_nothing_was_recorded_and_what_to_try():
    """No row: the title, then why (no instrumented layer, recording off, ranges only) and
    no 0 ns."""
    text = str(registry.summary())
    lines = text.splitlines()
    assert len(lines) == 4 and "0.000" not in text
    assert "record='ranges'" in lines[3] and "view REPORT" in lines[3]
    assert lines[1].startswith("Nothing was recorded: no instrumented layer ran")
    assert "instrumented_convs.pyg" in text and "instrument(model)" in text
    assert "configure(enabled=True)" in text and "INSTRUMENTED_CONVS_DISABLE" in text
    assert "Nothing was recorded" in registry.summary().select("forward").table()


def test_a_filter_that_matched_nothing_says_so_with_the_paths_there_are(clock):
    """``select`` (``view --prefix``) with no row: the filter, the top paths, a guess."""
    s = _recorded(clock)
    text = s.select("GCNConv").table()
    assert "Nothing was recorded" not in text and "0.000" not in text
    assert "The filter (prefix 'GCNConv') matched no step" in text
    assert "the paths start with forward/" in text
    assert "did you mean forward/GCNConv?" in text
    backward = s.select("forward", phase="backward").table()
    assert "(prefix 'forward', phase 'backward')" in backward
    assert "No backward step was recorded." in backward
    assert len(s.select("forward").table().splitlines()) > 3  # a table with rows is as before
