"""The house's rules, between its parts: arrows point down, and each part is reached through
what it offers.

The parts are the subpackages (``core``, ``layers``, ``pyg``, ``dgl``, ``workers``,
``report``, ``commands``) and the public modules at the root (the face, ``distributed``,
``roofline``, ``testing``). The import graph is read from the source with ``ast``: every
import, at any depth, so a lazy import inside a function counts too. The rules:

- the core imports nothing above it; its folders hold at most 12 modules each, and its jobs
  (subpackages) import each other in one direction: no cycle between them;
- the report reads snapshots only: of the core, just ``core.storage.entry`` (the snapshot's
  data);
- the layers know the core (and not the report, PyG's or DGL's layers, or the commands);
  ``pyg`` and ``dgl`` know the layers and the core, not each other;
- the data loaders' recorder (``workers``) knows the core (its steps, its registry) and the
  report's API (to print what it recorded);
- the commands use the public face, the public modules and the API of a part (its package,
  never a module inside another part): ``instrumented_convs``, ``.core``, ``.layers``,
  ``.report``, ``.pyg``, ``.dgl``, ``.workers``, ``.roofline``, ``.testing``, ``.distributed``;
- the integrations (``lightning``, ``notebook``) use what the commands may, and ``run``'s
  API (``.commands.launch``); no other module imports them (but the face's ``%load_ext``
  hook, lazily, the notebook), and without their package they raise ImportError naming
  the extra to install;
- no cycle of imports anywhere in the package (a function-level import counts);
- every module imports first in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from typing import Dict, List, Set

import pytest

from .helpers import ROOT, child_env

PACKAGE = ROOT / "instrumented_convs"
PKG = "instrumented_convs"
PARTS = ("core", "layers", "pyg", "dgl", "workers", "report", "commands")
#: The public modules at the root besides the face.
PUBLIC = ("distributed", "roofline", "testing")
#: The integrations at the root: each needs its package (an extra), nothing needs them.
INTEGRATIONS = {"lightning": ("lightning", "pytorch_lightning"), "notebook": ("IPython",)}


def modules() -> Dict[str, str]:
    """Every module of the package, dotted name -> path (a package is its ``__init__``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = str(path)
    return out


MODULES = modules()


def imports(name: str) -> Set[str]:
    """The package modules that module ``name`` imports, anywhere in its source (``from X
    import y`` counts ``X.y`` where that is a module, else ``X``)."""
    path = MODULES[name]
    is_pkg = path.endswith("__init__.py")
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not (mod == PKG or mod.startswith(PKG + ".")):
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                found.add(sub if sub in MODULES else mod)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PKG or alias.name.startswith(PKG + "."):
                    n = alias.name
                    while n not in MODULES and "." in n:
                        n = n.rsplit(".", 1)[0]
                    found.add(n)
    found.discard(name)
    return {m for m in found if m in MODULES}


GRAPH = {m: imports(m) for m in MODULES}


def part(name: str) -> str:
    """The part a module belongs to: a subpackage, or a root module's own name."""
    rest = name.split(".")[1:]
    if not rest:
        return "face"
    return rest[0]


def inside(name: str, p: str) -> bool:
    return name == f"{PKG}.{p}" or name.startswith(f"{PKG}.{p}.")


def test_the_graph_is_read_and_every_part_is_there():
    assert {part(m) for m in MODULES} == {*PARTS, *PUBLIC, *INTEGRATIONS, "face", "__main__"}
    assert f"{PKG}.core.steps.step" in GRAPH[f"{PKG}.layers"]  # the public API of layer authors


def test_the_core_imports_nothing_above_it():
    for m in (m for m in MODULES if inside(m, "core")):
        above = {d for d in GRAPH[m] if not inside(d, "core")}
        assert not above, f"{m} imports {sorted(above)}: the core imports nothing above it"


def cycle_in(graph: Dict[str, Set[str]]) -> List[str]:
    """One cycle of ``graph`` (a list of its nodes, the first repeated last), or []."""
    state: Dict[str, int] = {}
    path: List[str] = []

    def walk(n: str) -> List[str]:
        state[n] = 1
        path.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return path[path.index(d) :] + [d]
            if d not in state:
                found = walk(d)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return []

    for n in sorted(graph):
        if n not in state:
            found = walk(n)
            if found:
                return found
    return []


def test_no_cycle_of_imports_anywhere_in_the_package():
    """A package's ``__init__`` that imports its own modules lazily (its API, read on first
    use) is not a module a submodule depends on: its edges to its own submodules are left
    out; every other import counts, at any depth of a function."""

    def own(pkg: str, d: str) -> bool:
        return MODULES[pkg].endswith("__init__.py") and d.startswith(pkg + ".")

    graph = {m: {d for d in deps if not own(m, d)} for m, deps in GRAPH.items()}
    found = cycle_in(graph)
    assert not found, "an import cycle: " + " -> ".join(found)


def test_the_cycle_finder_finds_one():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_cores_jobs_import_each_other_in_one_direction():
    """The core's subpackages (its jobs) as nodes: an import between two modules is an edge
    between their jobs; no cycle."""

    def job(m: str) -> str:
        return ".".join(m.split(".")[:3])

    jobs: Dict[str, Set[str]] = {}
    for m in (m for m in MODULES if inside(m, "core") and m != f"{PKG}.core"):
        jobs.setdefault(job(m), set()).update(
            job(d)
            for d in GRAPH[m]
            if inside(d, "core") and d != f"{PKG}.core" and job(d) != job(m)
        )
    found = cycle_in(jobs)
    assert not found, "the core's jobs import each other in a circle: " + " -> ".join(found)


def test_every_folder_of_the_core_holds_at_most_twelve_modules():
    for folder in [PACKAGE / "core", *(p for p in (PACKAGE / "core").rglob("*") if p.is_dir())]:
        if folder.name == "__pycache__":
            continue
        mods = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        mods += [p for p in folder.iterdir() if (p / "__init__.py").exists()]
        assert len(mods) <= 12, (
            f"{folder} holds {len(mods)} modules: {sorted(p.name for p in mods)}"
        )


def test_the_report_reads_snapshots_only():
    for m in (m for m in MODULES if inside(m, "report")):
        other = {d for d in GRAPH[m] if not inside(d, "report")}
        assert other <= {f"{PKG}.core.storage.entry"}, (
            f"{m} imports {sorted(other)}: the report reads snapshots (core.storage.entry) only"
        )


@pytest.mark.parametrize("layer", ["layers", "pyg", "dgl"])
def test_layers_know_the_core_and_not_what_is_above_or_beside_them(layer):
    allowed = {"core", "layers", layer}
    for m in (m for m in MODULES if inside(m, layer)):
        other = {d for d in GRAPH[m] if part(d) not in allowed}
        assert not other, f"{m} imports {sorted(other)}"


def test_the_loaders_recorder_knows_the_core_and_the_reports_api():
    for m in (m for m in MODULES if inside(m, "workers")):
        other = {d for d in GRAPH[m] if part(d) not in ("core", "workers")} - {f"{PKG}.report"}
        assert not other, f"{m} imports {sorted(other)}: the recorder knows the core only"


API = ("core", "layers", "report", "pyg", "dgl", "workers")  #: the parts' packages


def test_commands_use_the_face_the_public_modules_and_each_parts_api():
    allowed = {PKG, *(f"{PKG}.{p}" for p in API)}
    allowed |= {f"{PKG}.{p}" for p in PUBLIC}
    for m in (m for m in MODULES if inside(m, "commands")):
        other = {d for d in GRAPH[m] if not inside(d, "commands") and d not in allowed}
        assert not other, (
            f"{m} imports {sorted(other)}: a command reaches a part through its package only"
        )


def test_integrations_use_what_commands_may_and_runs_api_and_nothing_imports_them():
    allowed = {PKG, *(f"{PKG}.{p}" for p in API)}
    allowed |= {f"{PKG}.{p}" for p in PUBLIC} | {f"{PKG}.commands.launch"}
    for name in INTEGRATIONS:
        m = f"{PKG}.{name}"
        other = GRAPH[m] - allowed
        assert not other, f"{m} imports {sorted(other)}"
        users = sorted(u for u, deps in GRAPH.items() if m in deps)
        if name == "notebook":  # %load_ext instrumented_convs: the face's hook imports it
            users.remove(PKG)
        assert not users, f"{users} import {m}: an integration is needed by nothing"


@pytest.mark.parametrize("name", sorted(INTEGRATIONS))
def test_an_integration_without_its_package_names_the_extra(name):
    hide = "; ".join(f"sys.modules[{p!r}] = None" for p in INTEGRATIONS[name])
    code = (
        f"import sys; {hide}\n"
        f"try:\n    import {PKG}.{name}\n"
        "except ImportError as e:\n    print(e)\nelse:\n    print('imported')"
    )
    proc = _python(code)
    assert f"instrumented_convs[{name}]" in proc.stdout, proc.stdout + proc.stderr


def test_no_module_of_one_part_reaches_a_private_module_of_another():
    for m, deps in GRAPH.items():
        for d in deps:
            leaf = d.rsplit(".", 1)[-1]
            if leaf.startswith("_") and part(d) != part(m):
                pytest.fail(f"{m} imports {d}, a private module of another part")


def test_the_root_holds_at_most_twelve_entries_besides_init_and_main():
    entries = [
        p.name
        for p in PACKAGE.iterdir()
        if p.name not in ("__init__.py", "__main__.py", "__pycache__")
        and not p.name.endswith((".so", ".pyd"))
    ]
    assert len(entries) <= 12, sorted(entries)


def test_the_parser_sees_lazy_relative_and_absolute_imports(tmp_path, monkeypatch):
    src = (
        "def f():\n    from .steps.step import Step\n    from .storage import registry\n"
        "import instrumented_convs.pyg\nfrom ..report import Summary\n"
    )
    monkeypatch.setitem(MODULES, f"{PKG}.core.probe_for_the_test", str(tmp_path / "p.py"))
    (tmp_path / "p.py").write_text(src)
    assert imports(f"{PKG}.core.probe_for_the_test") == {
        f"{PKG}.core.steps.step",
        f"{PKG}.core.storage.registry",
        f"{PKG}.pyg",
        f"{PKG}.report",
    }


def longest_chain() -> List[str]:
    """The longest chain of imports between the package's modules (every import; a package's
    ``__init__`` a module of its own), as reported in the house's issue."""
    best: Dict[str, List[str]] = {}
    state: Dict[str, int] = {}

    def walk(n: str) -> List[str]:
        if n in best:
            return best[n]
        state[n] = 1
        out = [n]
        for d in sorted(GRAPH[n]):
            if state.get(d) == 1:
                continue  # a package's lazy API importing its own modules: no chain
            p = walk(d)
            if len(p) + 1 > len(out):
                out = [n] + p
        state[n] = 2
        best[n] = out
        return out

    return max((walk(n) for n in sorted(GRAPH)), key=len)


def test_the_longest_chain_of_imports_is_shorter_than_before():
    chain = longest_chain()
    assert len(chain) < 23, " -> ".join(chain)  # 23 modules before the house (issue 38)


#: Modules longer than about 500 lines, and why each is one job all the same (the guarded
#: upstream copies apart: their layout is upstream's).
LONG: Dict[str, str] = {}
COPIES = {"pyg/gcn.py", "dgl/graphconv.py"}


def test_modules_are_one_job_each_and_long_ones_say_why():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        lines = len(path.read_text().splitlines())
        if lines > 500 and rel not in COPIES:
            assert rel in LONG, f"{rel} has {lines} lines: one job? say why in LONG, or split it"


#: A fresh interpreter that imports the third-party packages once (torch, PyG, DGL, the
#: integrations' packages where installed), then forks a child per module given on stdin: the
#: child imports that module first of the package, then reads a summary. Ours are imported in
#: the children only, so each is first in its own; what the parent imported is not ours.
FORK_SERVER = """
import importlib, json, os, sys, traceback
import torch
torch.set_num_threads(1)
third = ("torch._dynamo", "torch_geometric", "dgl", "lightning", "pytorch_lightning", "IPython")
for name in third:
    try:
        importlib.import_module(name)
    except Exception:
        pass
assert not [m for m in sys.modules if m.startswith("instrumented_convs")]
out = {}
for module in json.load(sys.stdin):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(module)
            import instrumented_convs as ic
            ic.registry.summary()
            error = ""
        except BaseException:
            error = traceback.format_exc()
        os.write(w, error.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        error = f.read().decode()
    _, status = os.waitpid(pid, 0)
    out[module] = error or ("" if status == 0 else f"the child ended with status {status}")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh_imports() -> Dict[str, str]:
    """Every module imported first in a child of the fork server: module -> its error."""
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SERVER],
        input=json.dumps(sorted(MODULES)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_first_in_a_fresh_interpreter(module, fresh_imports):
    needs = {"pyg": "torch_geometric", "dgl": "dgl"}
    p = part(module)
    if p in needs:
        pytest.importorskip(needs[p])
    if p in INTEGRATIONS:
        pytest.importorskip(INTEGRATIONS[p][0])
        pytest.importorskip("torch_geometric")  # (run's API, as the commands' launch)
    if p == "commands" and any(s in module for s in ("study", "check", "launch")):
        pytest.importorskip("torch_geometric")
    assert fresh_imports[module] == "", fresh_imports[module]


def test_the_fork_server_sees_a_module_that_cannot_import_first(tmp_path, monkeypatch):
    """A module importing a name its package defines only later fails first, not second."""
    pkg = tmp_path / "probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .b import B\nA = 1\n")
    (pkg / "b.py").write_text("from . import A\nB = 2\n")
    code = FORK_SERVER.replace("import instrumented_convs as ic", "pass").replace(
        "ic.registry.summary()", "pass"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(["probe_pkg.b", "json"]),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
    )
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "ImportError" in got["probe_pkg.b"] and got["json"] == ""


def _python(code: str) -> "subprocess.CompletedProcess[str]":
    """Run ``python -c code`` in a fresh interpreter, from the repository root."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
    )
