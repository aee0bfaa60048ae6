"""The copies of upstream code: "upstream plus steps, nothing else", and the fallback on drift.

For every copied upstream function, the copy with its ``with <step>:`` blocks replaced by
their bodies has the same normalised syntax tree as the installed upstream function
(on the PyG and DGL releases where the copy is used), and a drifted upstream makes the
layer run upstream's own code: the same numbers as the drifted stock layer.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
import textwrap
import types

import pytest

from instrumented_convs.core.steps.step import Step
from instrumented_convs.layers.guard import fingerprint, function_tree, global_names, guard

from .helpers import run_script


def _is_step(module):
    """``with X:`` where X is one of ``module``'s Step objects."""
    return lambda e: isinstance(e, ast.Name) and isinstance(getattr(module, e.id, None), Step)


def _copies():
    """(module, guarded name, our copy, installed upstream function, package version)."""
    out = []
    try:
        import torch_geometric

        import instrumented_convs.pyg.gcn as P

        out += [
            (
                P,
                "gcn_norm",
                P._instrumented_gcn_norm,
                P._stock_gcn_norm,
                torch_geometric.__version__,
            ),
            (
                P,
                "GCNConv.forward",
                P.GCNConv._instrumented_forward,
                P._StockGCNConv.forward,
                torch_geometric.__version__,
            ),
        ]
    except ImportError:
        pass
    try:
        import dgl

        import instrumented_convs.dgl.graphconv as D

        out += [
            (
                D,
                "GraphConv.forward",
                D._instrumented_graph_conv_forward,
                D._StockGraphConv.forward,
                dgl.__version__,
            ),
            (
                D,
                "EdgeWeightNorm.forward",
                D._instrumented_edge_weight_norm_forward,
                D._StockEdgeWeightNorm.forward,
                dgl.__version__,
            ),
        ]
    except ImportError:
        pass
    return out


COPIES = _copies()
IDS = [c[1] for c in COPIES]


@pytest.mark.parametrize("module, name, ours, upstream, version", COPIES, ids=IDS)
def test_copy_without_its_steps_is_upstream(module, name, ours, upstream, version):
    stripped = fingerprint(ours, _is_step(module))
    known = module.KNOWN[name]
    # one copy, one fingerprint: the copy stripped of its steps is what KNOWN records
    assert list(known) == [stripped]
    installed = fingerprint(upstream)
    assert module.DETAILED[name] == (installed == stripped)
    # the release list is honest: a listed release matches, an unlisted one does not
    assert (version in known[stripped].split()) == (installed == stripped), (
        f"{name}: installed {version} {'matches' if installed == stripped else 'differs'}; "
        f"update KNOWN's release list"
    )


@pytest.mark.parametrize("module, name, ours, upstream, version", COPIES, ids=IDS)
def test_copy_has_steps_and_only_steps_are_stripped(module, name, ours, upstream, version):
    tree = function_tree(ours)
    steps = [
        w
        for w in ast.walk(tree)
        if isinstance(w, ast.With) and all(_is_step(module)(i.context_expr) for i in w.items)
    ]
    assert len(steps) >= 3
    step_names = {i.context_expr.id for w in steps for i in w.items}
    from instrumented_convs.layers.guard import _normalised

    left = global_names(_normalised(tree, _is_step(module)))
    assert not step_names & left  # every step block is gone, nothing else refers to them


def _other_pythons():
    """The other CPython interpreters of this machine that the package supports (3.9 and
    newer), by version: pyenv's, and python3.X on the PATH."""
    import glob
    import re
    import shutil

    roots = [os.path.expanduser("~/.pyenv/versions"), "/opt/pyenv/versions"]
    paths = [p for r in roots for p in sorted(glob.glob(os.path.join(r, "3.*/bin/python3")))]
    paths += [shutil.which(f"python3.{minor}") or "" for minor in range(9, 16)]
    found = {}
    for path in paths:
        m = re.search(r"/3\.(\d+)[^/]*/bin/python3$|python3\.(\d+)$", path)
        if m and os.access(path, os.X_OK):
            ver = (3, int(m.group(1) or m.group(2)))
            if ver >= (3, 9) and ver != sys.version_info[:2]:
                found.setdefault(ver, path)
    return found


GUARD_SOURCE = os.path.join(
    os.path.dirname(__file__), "..", "instrumented_convs", "layers", "guard.py"
)
OTHER_PYTHONS = _other_pythons()


@pytest.mark.skipif(not COPIES, reason="neither PyG nor DGL is installed")
@pytest.mark.skipif(not OTHER_PYTHONS, reason="no other Python 3.9+ on this machine")
@pytest.mark.parametrize("ver", sorted(OTHER_PYTHONS), ids=lambda v: "%d.%d" % v)
def test_fingerprints_are_the_same_on_every_python(ver, tmp_path):
    """A fingerprint must not depend on the Python that computes it: ``ast.dump``'s text
    does (3.12 adds ``type_params=[]``), and on the GPU machine's Python 3.12 every copy fell
    back to upstream's code (2026-11-26). The upstream functions' source, fingerprinted by
    _guard.py under another interpreter (it needs only the standard library), gives the
    fingerprints KNOWN records."""
    import inspect
    import json
    import subprocess

    sources = {
        name: textwrap.dedent(inspect.getsource(inspect.unwrap(up))) for _, name, _, up, _ in COPIES
    }
    (tmp_path / "sources.json").write_text(json.dumps(sources))
    code = textwrap.dedent(f"""
        import ast, importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("g", {GUARD_SOURCE!r})
        g = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(g)
        sources = json.load(open({str(tmp_path / "sources.json")!r}))
        out = {{}}
        for name, src in sources.items():
            tree = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef))
            out[name] = g.fingerprint(tree)
        print(json.dumps(out))
    """)
    done = subprocess.run(
        [OTHER_PYTHONS[ver], "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    theirs = json.loads(done.stdout)
    here = {name: fingerprint(up) for _, name, _, up, _ in COPIES}
    assert theirs == here


def test_main_environment_runs_the_detailed_copies():
    """The pinned environments' releases (PyG 2.8.1, DGL 1.1.3 / 2.1.0) use every copy."""
    if os.environ.get("INSTRUMENTED_CONVS_PYG_MATRIX"):
        pytest.skip("a PyG release of the version matrix")
    for module, name, *_ in COPIES:
        assert module.DETAILED[name], name


def _f(a: int, b: "str" = "x") -> int:
    """A docstring."""
    return a + len(b)


def _g(a, b="x"):
    return a + len(b)


def _h(a, b="y"):
    return a + len(b)


def test_fingerprint_ignores_docstring_annotations_and_name_only():
    assert fingerprint(_f) == fingerprint(_g)
    assert fingerprint(_g) != fingerprint(_h)  # a default changed


def test_guard_rejects_a_global_that_is_not_upstreams_object(tmp_path):
    src = "import math\n\ndef f(x):\n    return math.sqrt(x) + len(str(x))\n"
    path = tmp_path / "drifted_mod.py"
    path.write_text(src)
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module("drifted_mod")
    finally:
        sys.path.remove(str(tmp_path))
    known = {fingerprint(mod.f): "test"}
    import math

    assert guard("f", mod.f, known, {"math": math}).ok
    other = types.SimpleNamespace(sqrt=math.sqrt)
    g = guard("f", mod.f, known, {"math": other})
    assert not g.ok and "'math'" in g.reason
    assert not guard("f", mod.f, {}, {"math": math}).ok  # unknown fingerprint


def test_guard_fails_closed_without_source():
    fn = eval("lambda x: x")  # no source file
    assert not guard("f", fn, {}, {}).ok


# -- drift: a changed upstream makes the layer run upstream's own code ------------------


def _run(code: str, tmp_path):
    """Run ``code`` as a script (so that inspect.getsource sees its functions)."""
    script = tmp_path / "drift.py"
    script.write_text(textwrap.dedent(code))
    return run_script(str(script), warnings=None, timeout=300)


PYG_PRELUDE = """
import torch
import torch_geometric
import torch_geometric.nn.conv.gcn_conv as gc
from torch_geometric.nn import GCNConv as Stock

ORIGINAL_FORWARD, ORIGINAL_NORM = Stock.forward, gc.gcn_norm
"""

PYG_CHECK = """
import instrumented_convs as ic
from instrumented_convs.pyg import GCNConv, DETAILED

torch.manual_seed(0)
x, ei = torch.randn(8, 4), torch.randint(0, 8, (2, 30))
stock = Stock(4, 3)
ours = GCNConv(4, 3)
ours.load_state_dict(stock.state_dict())
out = ours(x, ei)
torch.testing.assert_close(out, stock(x, ei))  # the drifted stock's numbers
undo()  # the drift matters: upstream as it was gives other numbers
assert not torch.allclose(out, stock(x, ei))
print("DETAILED", sorted(k for k, v in DETAILED.items() if not v))
print("ROWS", [r.name for r in ic.registry.summary()])
"""


def _drift_premise(module):
    """Drift tests start from a release our copies match (a PyG release of the version
    matrix may already run upstream's forward: there the drift mechanism is the same and
    is tested in the main environment)."""
    if not all(module.DETAILED.values()):
        pytest.skip(f"the installed release already runs upstream's code: {module.DETAILED}")


def _check_warning(proc, layer, package):
    lines = [line for line in proc.stderr.splitlines() if "runs upstream's own code" in line]
    assert len(lines) == 1, proc.stderr
    assert layer in lines[0] and package in lines[0]


def test_pyg_forward_drift_runs_upstreams_forward(tmp_path):
    pytest.importorskip("torch_geometric")
    import instrumented_convs.pyg.gcn as P

    _drift_premise(P)
    proc = _run(
        PYG_PRELUDE
        + """
def forward(self, x, edge_index, edge_weight=None):
    return ORIGINAL_FORWARD(self, x, edge_index, edge_weight) * 2  # a future release

Stock.forward = forward

def undo():
    Stock.forward = ORIGINAL_FORWARD
"""
        + PYG_CHECK,
        tmp_path,
    )
    _check_warning(proc, "GCNConv", "torch_geometric")
    assert "DETAILED ['GCNConv.forward']" in proc.stdout
    # upstream's forward, its parts timed from outside: all but the bias (its own time)
    rows = [
        "GCNConv",
        "GCNConv/gcn_norm",
        "GCNConv/gcn_norm/add_remaining_self_loops",
        "GCNConv/gcn_norm/degree",
        "GCNConv/gcn_norm/normalize",
        "GCNConv/lin",
        "GCNConv/propagate",
        "GCNConv/propagate/collect",
        "GCNConv/propagate/message",
        "GCNConv/propagate/aggregate",
        "GCNConv/propagate/update",
    ]
    assert f"ROWS {rows}" in proc.stdout
    assert "its parts are timed from outside" in proc.stderr


def test_pyg_gcn_norm_drift_runs_upstreams_gcn_norm(tmp_path):
    pytest.importorskip("torch_geometric")
    import instrumented_convs.pyg.gcn as P

    _drift_premise(P)
    proc = _run(
        PYG_PRELUDE
        + """
def gcn_norm(edge_index, edge_weight=None, num_nodes=None, improved=False,
             add_self_loops=True, flow="source_to_target", dtype=None):
    ei, ew = ORIGINAL_NORM(edge_index, edge_weight, num_nodes, improved, add_self_loops, \
flow, dtype)
    return ei, ew * 3  # a future release

gc.gcn_norm = gcn_norm

def undo():
    gc.gcn_norm = ORIGINAL_NORM
"""
        + PYG_CHECK,
        tmp_path,
    )
    _check_warning(proc, "GCNConv", "torch_geometric")
    assert "DETAILED ['gcn_norm']" in proc.stdout
    # forward is still the copy; gcn_norm is one step with upstream's code inside
    assert "'GCNConv/gcn_norm', 'GCNConv/lin'" in proc.stdout


def test_pyg_global_drift_is_caught_even_with_the_same_code(tmp_path):
    """Upstream's module binds another ``scatter``: same source text, other numbers."""
    pytest.importorskip("torch_geometric")
    import instrumented_convs.pyg.gcn as P

    _drift_premise(P)
    proc = _run(
        PYG_PRELUDE
        + """
ORIGINAL_SCATTER = gc.scatter

def scatter(*args, **kwargs):
    return ORIGINAL_SCATTER(*args, **kwargs) + 1.0  # a future release's degree

gc.scatter = scatter

def undo():
    gc.scatter = ORIGINAL_SCATTER
"""
        + PYG_CHECK,
        tmp_path,
    )
    _check_warning(proc, "GCNConv", "torch_geometric")
    assert "DETAILED ['gcn_norm']" in proc.stdout


DGL_PRELUDE = """
import torch
import dgl
from dgl.nn import GraphConv as Stock, EdgeWeightNorm as StockNorm

ORIGINAL_FORWARD, ORIGINAL_NORM = Stock.forward, StockNorm.forward
"""


def test_dgl_drift_runs_upstreams_forward(tmp_path):
    pytest.importorskip("dgl")
    import instrumented_convs.dgl.graphconv as D

    _drift_premise(D)
    proc = _run(
        DGL_PRELUDE
        + """
def forward(self, graph, feat, weight=None, edge_weight=None):
    return ORIGINAL_FORWARD(self, graph, feat, weight, edge_weight) - 1  # a future release

def norm_forward(self, graph, edge_weight):
    return ORIGINAL_NORM(self, graph, edge_weight) * 5

Stock.forward = forward
StockNorm.forward = norm_forward

import instrumented_convs as ic
from instrumented_convs.dgl import GraphConv, EdgeWeightNorm, DETAILED

torch.manual_seed(0)
g = dgl.add_self_loop(dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0]))))
x, w = torch.randn(4, 5), torch.rand(g.num_edges()) + 0.1
stock, ours = Stock(5, 3), GraphConv(5, 3)
ours.load_state_dict(stock.state_dict())
torch.testing.assert_close(ours(g, x), stock(g, x))
torch.testing.assert_close(EdgeWeightNorm()(g, w), StockNorm()(g, w))
assert not torch.allclose(ours(g, x), ORIGINAL_FORWARD(stock, g, x))
print("DETAILED", sorted(k for k, v in DETAILED.items() if not v))
print("ROWS", sorted({r.name for r in ic.registry.summary()}))
print("KINDS", [r.kind for r in ic.registry.summary() if r.name in ("GraphConv", "EdgeWeightNorm")])
""",
        tmp_path,
    )
    lines = [line for line in proc.stderr.splitlines() if "runs upstream's own code" in line]
    assert len(lines) == 2 and "GraphConv" in lines[0] and "EdgeWeightNorm" in lines[1], proc.stderr
    assert "DETAILED ['EdgeWeightNorm.forward', 'GraphConv.forward']" in proc.stdout
    # the fallback keeps a breakdown: upstream's forward run as a generic layer runs it (here
    # the future forward's call of the old one, and DGL's calls under it), marked upstream
    for row in (
        "'GraphConv/ORIGINAL_FORWARD/update_all/gspmm'",
        "'GraphConv/ORIGINAL_FORWARD/in_degrees'",
        "'EdgeWeightNorm/ORIGINAL_NORM/apply_edges'",
        "'EdgeWeightNorm/ORIGINAL_NORM/update_all'",
    ):
        assert row in proc.stdout
    assert "KINDS ['upstream', 'upstream']" in proc.stdout
