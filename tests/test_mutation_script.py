"""scripts/mutation.py (not run in CI: it takes minutes a module): what it mutates and with
which tests still exists, the survivors docs/testing.md explains are of those modules, and
mutmut's section it writes is the TOML it means."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import tomllib

from .helpers import ROOT


@pytest.fixture(scope="module")
def mutation():
    spec = importlib.util.spec_from_file_location("mutation", ROOT / "scripts" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["mutation"]


def test_each_module_and_each_test_it_runs_exist(mutation):
    for module, selection in mutation.TARGETS.items():
        assert (ROOT / "instrumented_convs" / module).is_file(), module
        files = [a for a in selection if a.startswith("tests/")]
        assert files, module
        for name in files:
            assert (ROOT / name).is_file(), f"{module}: {name}"


def test_the_explained_survivors_are_mutants_of_the_modules_mutated(mutation):
    known = mutation.explained()
    assert known, "docs/testing.md names no survivor"
    modules = {
        "instrumented_convs." + m.removesuffix(".py").replace("/", ".") for m in mutation.TARGETS
    }
    for name, why in known.items():
        module = name.split(".x", 1)[0]
        assert module in modules, name
        assert len(why) > 20, name  # a reason, not a word


def test_mutmuts_section_is_the_toml_it_means(mutation):
    selection = mutation.TARGETS["report/stats.py"]
    text = "[project]\nname = 'x'\n" + mutation._config("report/stats.py", selection)
    section = tomllib.loads(text)["tool"]["mutmut"]
    assert section["only_mutate"] == ["instrumented_convs/report/stats.py"]
    assert section["pytest_add_cli_args_test_selection"] == selection
    assert "tests" in section["also_copy"] and "instrumented_convs" not in section["also_copy"]


def test_an_unknown_module_is_refused_by_name(mutation, capsys):
    with pytest.raises(SystemExit) as exit:
        mutation.main(["report/nothing.py"])
    assert exit.value.code == 2
    assert "not a module mutated here: report/nothing.py" in capsys.readouterr().err
