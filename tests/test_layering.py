"""The core's imports point down only: no cycle, and each module imports what its layer may.

The graph is read from the source with ``ast`` (every ``from . import x`` / ``from .x import``
/ ``import instrumented_convs.x``, at any depth, so a lazy import inside a function counts
too), and each module is imported first in a fresh interpreter.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from typing import Dict, Set

import pytest

from .helpers import ROOT, python_path

PACKAGE = ROOT / "instrumented_convs"

#: What each core module may import from the package. Bottom first: a module may import
#: only modules listed above it here.
ALLOWED: Dict[str, Set[str]] = {
    "_native": {"_speedups"},
    "_config": set(),
    "_clock": set(),
    "_stack": {"_native"},
    "_ranges": set(),
    "_table": set(),
    "_row": set(),
    "_saved": set(),
    "_page": {"_table"},
    "_roof": {"_table"},
    "_diff": {"_page", "_table"},
    "_entry": {"_native"},
    "_timeline": {"_clock", "_config", "_native"},
    "_formulas": set(),
    "_counters": {"_config", "_formulas", "_stack"},
    "_trace": {"_table"},
    "report": {"_diff", "_page", "_roof", "_row", "_saved", "_table", "_trace"},
    "_stats": {"_entry", "report"},
    "_probe": {"_roof"},
    "roofline": {"_probe", "_roof"},
    "_registry": {"_clock", "_counters", "_entry", "_timeline"},
    "distributed": {"_entry", "_registry", "_stats", "_timeline", "report"},
    "_frame": {"_clock", "_config", "_native", "_ranges", "_registry", "_stack", "_timeline"},
    "_backward": {"_clock", "_config", "_frame", "_native", "_registry", "_stack", "report"},
    "_sampling": {"_backward", "_config", "_native", "_registry", "_stack"},
    "_anchor": {"_backward", "_sampling", "_stack"},
    "_stepbase": {
        "_anchor",
        "_clock",
        "_config",
        "_entry",
        "_frame",
        "_native",
        "_ranges",
        "_registry",
        "_sampling",
        "_stack",
        "_timeline",
    },
    "_step": {
        "_anchor",
        "_backward",
        "_clock",
        "_config",
        "_frame",
        "_ranges",
        "_registry",
        "_stack",
        "_stepbase",
    },
    "testing": {"_clock", "_stack"},
    "_guard": set(),
    "_scan": set(),
    "_route": {"_scan", "_step"},
    "_statements": set(),
    "_split": {"_statements"},
    "_wrap": {"_split", "_statements"},
    "_own": {"_split", "_statements", "_step", "_wrap"},
    "layers": {"_step"},
    "_layers": {"_native", "_step"},
    "_generic": {"_config", "_layers", "_native", "_own", "_route", "_scan", "_step"},
    "_pyg_generic": {"_generic", "_layers", "_scan", "_step"},
    "_dgl_wrap": {"_counters", "_formulas", "_generic", "_stack", "_step"},
    "_dgl_generic": {"_counters", "_dgl_wrap", "_generic", "_layers", "_scan", "_step"},
    "pyg": {"_generic", "_guard", "_layers", "_pyg_generic", "_route", "_step"},
    "dgl": {"_dgl_generic", "_generic", "_guard", "_layers", "_step"},
    "_instrument": {"_generic", "_layers", "_pyg_generic"},
}
CORE = list(ALLOWED)
#: Compiled modules (no source here): allowed where listed, not themselves checked.
COMPILED = {"_speedups"}
#: Modules that need a framework to import (skipped in an environment without it).
NEEDS = {
    "pyg": "torch_geometric",
    "dgl": "dgl",
    "_pyg_generic": "torch_geometric",
    "_dgl_generic": "dgl",
    "_dgl_wrap": "dgl",
}


def package_imports(module: str) -> Set[str]:
    """The package modules that ``module`` imports, anywhere in its source."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                if node.module:  # from .x import y
                    found.add(node.module.split(".")[0])
                else:  # from . import x, y
                    found.update(alias.name for alias in node.names)
            elif node.level == 0 and node.module and node.module.startswith("instrumented_convs."):
                found.add(node.module.split(".")[1])
            elif node.level == 0 and node.module == "instrumented_convs":
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("instrumented_convs."):
                    found.add(alias.name.split(".")[1])
                elif alias.name == "instrumented_convs":
                    found.add("__init__")
    return found


def test_core_modules_import_only_what_their_layer_allows():
    for module in CORE:
        extra = package_imports(module) - ALLOWED[module]
        assert not extra, f"{module} imports {sorted(extra)}: an arrow pointing up or sideways"


def test_import_graph_is_acyclic_and_the_layers_are_ordered():
    graph = {m: package_imports(m) - COMPILED for m in CORE}
    # Kahn: repeatedly remove modules whose imports are all removed already.
    done: Set[str] = set()
    while len(done) < len(graph):
        ready = [m for m, deps in graph.items() if m not in done and deps <= done]
        assert ready, f"import cycle among {sorted(set(graph) - done)}"
        done.update(ready)
    for i, module in enumerate(CORE):  # the declared order is itself a valid layering
        assert ALLOWED[module] - COMPILED <= set(CORE[:i]), (
            f"{module} is listed below something it imports"
        )


def test_the_bottom_knows_nothing_of_the_package():
    for module in ("_config", "_clock", "_table", "_row", "_saved"):
        assert package_imports(module) == set(), module
    for module in ("_stack", "_entry"):  # and the optional C extension, through _native
        assert package_imports(module) == {"_native"}, module
    assert package_imports("report") == {
        "_diff",
        "_page",
        "_roof",
        "_row",
        "_saved",
        "_table",
        "_trace",
    }  # its row type, renderers (table, page), saved-run reader, diff, timeline: nothing else


def test_the_parser_sees_lazy_and_absolute_imports(tmp_path, monkeypatch):
    src = (
        "def f():\n    from ._step import Step\n    from . import _clock, report\n"
        "import instrumented_convs.pyg\n"
    )
    (tmp_path / "probe.py").write_text(src)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert package_imports("probe") == {"_step", "_clock", "report", "pyg"}


@pytest.mark.parametrize("module", CORE + ["__init__"])
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    if module in NEEDS:
        pytest.importorskip(NEEDS[module])
    name = "instrumented_convs" if module == "__init__" else f"instrumented_convs.{module}"
    code = (
        f"import importlib; importlib.import_module({name!r}); "
        "import instrumented_convs as ic; ic.registry.summary()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=python_path()),
    )
    assert proc.returncode == 0, proc.stderr


def test_modules_stay_small():
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        assert lines <= 310, f"{path.relative_to(PACKAGE)} has {lines} lines; split it"
