"""tests/forkserver.py: a child forked from the server is what ``python`` would have been."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from . import forkserver
from .helpers import ROOT, child_env

PROBE = """
import atexit, json, os, sys, threading, time, warnings
def report():
    print(json.dumps({
        "name": __name__, "file": globals().get("__file__"), "argv": sys.argv,
        "path": sys.path[:3], "cwd": os.getcwd(), "var": os.environ.get("INSTRUMENTED_CONVS_PROBE"),
        "options": sys.warnoptions, "filters": [repr(f) for f in warnings.filters[:4]],
        "main": sys.modules["__main__"].__dict__ is globals(), "stdin": sys.stdin.read(),
    }))
report()
threading.Thread(target=lambda: (time.sleep(0.2), print("thread"))).start()
atexit.register(lambda: print("at exit"))
how = sys.argv[1]
if how == "exit":
    sys.exit(3)
if how == "message":
    sys.exit("a message")
if how == "raise":
    raise ValueError("raised")
if how == "interrupt":
    raise KeyboardInterrupt
"""


def _both(tmp_path, argv, var="x"):
    env = child_env(INSTRUMENTED_CONVS_PROBE=var)
    real = subprocess.run(
        [sys.executable, *argv], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    forked = forkserver.run(argv, env, str(tmp_path), 60)
    assert forked is not None, "the server declined a plain request"
    return real, forked


def _same(real, forked):
    seen = [json.loads(p.stdout.splitlines()[0]) for p in (real, forked)]
    assert {k: v for k, v in seen[1].items() if v != seen[0][k]} == {}, seen[0]
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
    # a traceback's lines name the same frames but the forked one's first (the server's own)
    assert forked.stderr.splitlines()[-1:] == real.stderr.splitlines()[-1:]


@pytest.mark.parametrize("how", ["end", "exit", "message", "raise", "interrupt"])
def test_a_forked_script_runs_and_ends_as_python_would(tmp_path, how):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    real, forked = _both(tmp_path, ["-W", "ignore::UserWarning", str(script), how])
    _same(real, forked)
    assert forked.returncode == {"end": 0, "exit": 3, "message": 1, "raise": 1}.get(how, -2)
    assert forked.stdout.splitlines()[1:] == ["thread", "at exit"]


def test_a_forked_module_and_code_get_their_argv_path_and_directory(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    _same(*_both(tmp_path, ["-m", "probe_mod", "end", "more"]))
    _same(*_both(tmp_path, ["-W", "error", "-c", PROBE, "end"], var="y"))


def test_the_server_declines_what_a_fork_could_change(tmp_path, monkeypatch):
    env = child_env()
    assert forkserver.run(["-X", "importtime", "-c", "pass"], env, str(tmp_path), 60) is None
    threads = dict(env, OMP_NUM_THREADS=str(int(env.get("OMP_NUM_THREADS", "1")) + 1))
    assert forkserver.run(["-c", "pass"], threads, str(tmp_path), 60) is None
    (tmp_path / "numpy").mkdir()  # a folder that would shadow what torch imported
    shadow = dict(env, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    assert forkserver.run(["-c", "pass"], shadow, str(tmp_path), 60) is None
    monkeypatch.setenv("INSTRUMENTED_CONVS_TESTS_FORK", "0")
    assert forkserver.run(["-c", "pass"], env, str(tmp_path), 60) is None


def test_a_forked_child_out_of_time_is_killed_as_subprocess_run_does(tmp_path):
    env = child_env()
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run(["-c", "import time; time.sleep(60)"], env, str(tmp_path), 0.5)
    again = forkserver.run(["-c", "print('next')"], env, str(tmp_path), 60)
    assert again is not None and again.stdout == "next\n"


def test_the_server_starts_anew_where_pytests_environment_changed(tmp_path, monkeypatch):
    """A test that sets a variable in pytest's own environment (Lightning's seed_everything
    does) would otherwise have every later child declined."""
    env = child_env()
    assert forkserver.run(["-c", "pass"], env, str(tmp_path), 60) is not None
    monkeypatch.setenv("INSTRUMENTED_CONVS_TESTS_OTHER", "1")  # free: the same server
    before = forkserver._server()
    monkeypatch.setenv("SOME_SETTING_OF_A_TEST", "1")
    env = child_env()
    code = "import os; print(os.environ['SOME_SETTING_OF_A_TEST'])"
    forked = forkserver.run(["-c", code], env, str(tmp_path), 60)
    assert forked is not None and forked.stdout == "1\n"
    assert forkserver._server() is not before and before.proc.poll() is not None
