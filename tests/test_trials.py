"""The advice, part 2 (issue 66): a change timed on the user's own layer at the end, nothing of
the user's moved (parameters, gradients, random states, the table), outputs compared, the
budget kept; the ``fused-sparse`` rule from what was timed."""

from __future__ import annotations

import importlib.util
import random
from types import SimpleNamespace

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs.core.meters import signals
from instrumented_convs.layers import trials
from instrumented_convs.report import rules
from instrumented_convs.report.rules import Record, decide, lines

from .helpers import random_graph

needs_pyg = pytest.mark.skipif(
    importlib.util.find_spec("torch_geometric") is None, reason="needs torch_geometric"
)


def _graph(n=400, e=3000, loops=False, seed=0):
    """Coalesced; the self-loops drawn kept where ``loops``, else none."""
    return random_graph(n, e, seed=seed, self_loops="some" if loops else "none", coalesced=True)


@pytest.fixture
def advising():
    signals.clear()
    saved = ic.configure(advise=True)
    yield
    saved.restore()
    signals.clear()


@pytest.fixture
def csr_only(monkeypatch):
    """fused-sparse's torch.sparse candidate alone (not SparseTensor, where torch-sparse is
    installed): the tests that count a rule's lines or read its one trial."""
    import instrumented_convs.pyg.trials  # noqa: F401 - registered first, into the list kept

    other = ("fused_sparse_tensor", "fused_edge_index")
    kept = [c for c in trials.CANDIDATES if c[2].__name__ not in other]
    monkeypatch.setattr(trials, "CANDIDATES", kept)


def _train(model, x, ei, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(x, ei).relu().sum().backward()
        opt.step()
    return opt


def _trial(layer, rule="fused-sparse"):
    (rec,) = [x for x in signals.describe()["layers"] if x["class"] == type(layer).__name__]
    return rec.get("trials", {}).get(rule)


@needs_pyg
def test_a_change_is_timed_on_the_layers_own_inputs_and_nothing_of_the_users_moves(advising):
    from instrumented_convs.pyg import SAGEConv

    x, ei = _graph()
    model = SAGEConv(16, 8)
    opt = _train(model, x, ei)
    before = {
        "params": [p.detach().clone() for p in model.parameters()],
        "grads": [p.grad.clone() for p in model.parameters()],
        "opt": repr(opt.state_dict()),
        "torch": torch.random.get_rng_state(),
        "python": random.getstate(),
        "rows": [(r.name, r.phase, r.count) for r in ic.registry.summary()],
    }
    assert trials.measure(1.0) == []
    assert all(torch.equal(a, b) for a, b in zip(before["params"], model.parameters()))
    assert all(torch.equal(a, p.grad) for a, p in zip(before["grads"], model.parameters()))
    assert repr(opt.state_dict()) == before["opt"]
    assert torch.equal(before["torch"], torch.random.get_rng_state())
    assert before["python"] == random.getstate()
    assert [(r.name, r.phase, r.count) for r in ic.registry.summary()] == before["rows"]
    t = _trial(model)
    assert t["equal"] and t["difference"] <= trials.RTOL and t["rounds"] >= 3
    assert t["stock_s"] > 0 and t["changed_s"] > 0 and t["convert_s"] > 0
    assert "adj_t" in t["change"]
    assert trials.measure(1.0) == [] and _trial(model)["rounds"] == t["rounds"]  # timed once


@needs_pyg
def test_a_change_whose_outputs_differ_is_timed_and_never_advised(advising, csr_only):
    """GCNConv given a graph with self-loops: its edge_index path replaces them
    (add_remaining_self_loops), the sparse one adds one more: not the same model."""
    from instrumented_convs.pyg import GCNConv

    x, ei = _graph(loops=True)
    model = GCNConv(16, 8)
    _train(model, x, ei)
    trials.measure(1.0)
    t = _trial(model)
    assert t is not None and not t["equal"] and t["difference"] > 1e-3
    items = decide(Record(ic.registry.summary(by="layer"), signals.describe()), min_share=0.0)
    assert "fused-sparse" not in {i["rule"] for i in items}


@needs_pyg
def test_the_budget_is_kept_and_what_was_not_timed_is_said(advising):
    from instrumented_convs.pyg import GINConv, SAGEConv

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = SAGEConv(16, 16), GINConv(torch.nn.Linear(16, 8))

        def forward(self, x, ei):
            return self.b(self.a(x, ei).relu(), ei)

    x, ei = _graph()
    model = Two()
    a, b = model.a, model.b
    _train(model, x, ei)
    skipped = trials.measure(1e-6)  # gone before the first change could start
    assert len(skipped) == 2 and all("no time left of the 1e-06 s" in s for s in skipped)
    assert _trial(a) is None and _trial(b) is None
    assert trials.measure(2.0) == []  # each its share of what is left, 3 rounds at least
    assert _trial(a)["rounds"] >= 3 and _trial(b)["rounds"] >= 3


@needs_pyg
def test_a_change_whose_rounds_would_not_fit_its_share_is_skipped_and_said(
    advising, csr_only, monkeypatch
):
    from instrumented_convs.pyg import SAGEConv

    x, ei = _graph()
    model = SAGEConv(16, 8)
    _train(model, x, ei)
    real = trials.forward_backward

    def slow(layer, inputs):  # a call of a second, as at arxiv's shape on this CPU
        out, _ = real(layer, inputs)
        return out, 1.0

    monkeypatch.setattr(trials, "forward_backward", slow)
    said = {line.split(": ")[1].split(" not timed")[0]: line for line in trials.measure(2.0)}
    # warm-up calls of 1 s: 3 rounds of stock, changed and stock again need 9 s; the three
    # changes share the 2 s (a third, then a half of what is left, then all of it)
    assert set(said) == {"lower-precision", "fused-sparse", "project-first"}
    assert all(s.startswith("SAGEConv (") for s in said.values())
    assert all("not timed: 3 rounds need about 9 s" in s for s in said.values())
    assert "its share of the 2 s was 0.67 s (--advise-seconds)" in said["lower-precision"]
    assert "its share of the 2 s was 2 s" in said["project-first"]
    assert all(_trial(model, rule) is None for rule in said)
    monkeypatch.setattr(
        trials, "forward_backward", lambda layer, inputs: (real(layer, inputs)[0], 50)
    )
    said = {line.split(": ")[1].split(" not timed")[0]: line for line in trials.measure(200.0)}
    # whole seconds from ten on, not 4.5e+02
    assert all("not timed: 3 rounds need about 450 s" in s for s in said.values())
    assert "its share of the 200 s was 67 s (--advise-seconds)" in said["lower-precision"]


class _Slower(torch.nn.Module):
    """A copy of a layer, its outputs scaled by ``scale``, a sleep of ``pause`` s a call."""

    def __init__(self, layer, pause=0.0, scale=1.0):
        super().__init__()
        self.layer, self.pause, self.scale = layer, pause, scale

    def forward(self, *args, **kwargs):
        import time

        time.sleep(self.pause)
        return self.layer(*args, **kwargs) * self.scale


@needs_pyg
@pytest.mark.parametrize("before", [False, True], ids=["after", "before"])
@pytest.mark.parametrize("other", ["slower", "faster but another model"])
def test_of_a_rules_candidates_on_a_layer_the_better_is_kept_the_other_named(
    advising, csr_only, monkeypatch, other, before
):
    """A second fused-sparse candidate, timed after the torch.sparse one or before it:
    slower and equal, or faster and not equal; either way the torch.sparse one is kept, the
    other named in ``also_timed`` and in the advice."""
    import copy

    from instrumented_convs.pyg import SAGEConv

    def second(layer, facts):
        pause, scale = (0.01, 1.0) if other == "slower" else (0.0, 2.0)
        wrapped = _Slower(copy.deepcopy(layer), pause, scale)
        return trials.Change("fused-sparse", "other", facts["inputs"], layer=wrapped, variant="B")

    extra = [("pyg", "fused-sparse", second)]
    listed = [*extra, *trials.CANDIDATES] if before else [*trials.CANDIDATES, *extra]
    monkeypatch.setattr(trials, "CANDIDATES", listed)
    x, ei = _graph(n=4000, e=80000)  # adj_t faster than a 10 ms pause, even under load
    model = SAGEConv(16, 8)
    _train(model, x, ei)
    assert trials.measure(5.0) == []
    t = _trial(model)
    assert t["variant"] == "torch.sparse CSR" and t["equal"], t
    (seen,) = t["also_timed"]
    assert seen["variant"] == "B" and seen["equal"] == (other == "slower")
    # the advice names it (a record whose saving is beyond the A/A, as on an idle machine)
    t = dict(t, stock_s=0.01, changed_s=0.005, paired_saving_s=0.005, aa_s=0.001, convert_s=0)
    (item,) = decide(_record(t), min_share=0.0)
    assert "; timed too: B " in item["why"] and item["why"].endswith("this is torch.sparse CSR")
    assert ("(not equal)" in item["why"]) == (other != "slower")


@needs_pyg
def test_a_rules_candidates_not_timed_for_want_of_time_are_each_named(
    advising, csr_only, monkeypatch
):
    from instrumented_convs.pyg import SAGEConv

    def second(layer, facts):
        return trials.Change("fused-sparse", "other", facts["inputs"], variant="B")

    monkeypatch.setattr(trials, "CANDIDATES", [*trials.CANDIDATES, ("pyg", "fused-sparse", second)])
    x, ei = _graph()
    model = SAGEConv(16, 8)
    _train(model, x, ei)
    real = trials.forward_backward
    monkeypatch.setattr(trials, "forward_backward", lambda layer, i: (real(layer, i)[0], 1.0))
    said = " | ".join(trials.measure(2.0))
    assert "fused-sparse (torch.sparse CSR) not timed" in said
    assert "fused-sparse (B) not timed" in said


@needs_pyg
@pytest.mark.sparse
def test_where_torch_sparse_is_installed_a_sparse_tensor_is_timed_too(advising):
    pytest.importorskip("torch_sparse")
    from instrumented_convs.pyg import GINConv

    x, ei = _graph()
    model = GINConv(torch.nn.Linear(16, 8))
    _train(model, x, ei)
    assert trials.measure(5.0) == []
    t = _trial(model)
    (seen,) = t["also_timed"]
    assert {t["variant"], seen["variant"]} == {"torch.sparse CSR", "SparseTensor"}
    assert t["equal"] and seen["equal"], t  # the same sums, in another order
    if t["variant"] == "SparseTensor":
        assert "SparseTensor(row=edge_index[1], col=edge_index[0]" in t["change"]


@needs_pyg
@pytest.mark.sparse
def test_gcnconv_on_a_graph_with_self_loops_is_equal_given_a_sparse_tensor(advising):
    """torch-sparse's gcn_norm sets the diagonal (fill_diag), as add_remaining_self_loops
    replaces the loops; torch.sparse's adds one more: the SparseTensor is kept."""
    pytest.importorskip("torch_sparse")
    from instrumented_convs.pyg import GCNConv

    x, ei = _graph(loops=True)
    model = GCNConv(16, 8)
    _train(model, x, ei)
    trials.measure(5.0)
    t = _trial(model)
    assert t["variant"] == "SparseTensor" and t["equal"], t
    (seen,) = t["also_timed"]
    assert seen["variant"] == "torch.sparse CSR" and not seen["equal"]


def _fuses_edge_index():
    from torch_geometric.nn import GraphConv

    return bool(getattr(GraphConv, "SUPPORTS_FUSED_EDGE_INDEX", False))


@needs_pyg
@pytest.mark.parametrize("weighted", [False, True])
def test_where_a_layer_fuses_an_edge_index_sorted_by_target_it_is_timed_too(
    advising, monkeypatch, weighted
):
    """GraphConv fuses an ``EdgeIndex`` sorted by column (PyG 2.6+): timed beside
    torch.sparse, the weights permuted as the edges, the same sums; the trial's calls are
    given the index itself (detached, it would be a plain tensor, not fused)."""
    from instrumented_convs.pyg import GraphConv

    if not _fuses_edge_index():
        pytest.skip("this PyG fuses no EdgeIndex")
    import torch_geometric

    fused = []
    matmul = torch_geometric.EdgeIndex.matmul
    monkeypatch.setattr(
        torch_geometric.EdgeIndex, "matmul", lambda *a, **k: fused.append(1) or matmul(*a, **k)
    )
    x, ei = _graph()
    w = torch.rand(ei.size(1)) if weighted else None
    model = GraphConv(16, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(x, ei, w).relu().sum().backward()
        opt.step()
    assert trials.measure(5.0) == []
    t = _trial(model)
    timed = {t["variant"]: t["equal"], **{s["variant"]: s["equal"] for s in t["also_timed"]}}
    assert timed.pop("EdgeIndex") is True and timed.pop("torch.sparse CSR") is True, t
    assert fused, "the EdgeIndex trial did not reach the fused product"
    if t["variant"] == "EdgeIndex":
        assert "sort_by('col')" in t["change"]
        assert ("edge_weight[perm]" in t["change"]) == weighted


@needs_pyg
def test_a_layer_that_fuses_no_edge_index_is_not_timed_given_one(advising):
    from instrumented_convs.pyg import SAGEConv

    x, ei = _graph()
    model = SAGEConv(16, 8)
    _train(model, x, ei)
    assert trials.measure(5.0) == []
    t = _trial(model)
    assert "EdgeIndex" not in [t["variant"], *(s["variant"] for s in t.get("also_timed", []))]


def test_a_trial_gives_an_input_that_needs_no_gradient_as_it_is_and_a_new_leaf_otherwise():
    index = torch.arange(6).view(2, 3)
    assert trials._leaf(index) is index and trials._leaf((index,))[0] is index
    x = torch.randn(3, 2, requires_grad=True) * 2
    leaf = trials._leaf(x)
    assert leaf.is_leaf and leaf.requires_grad and leaf is not x and torch.equal(leaf, x)


def _summary(rows, total):
    rows = [SimpleNamespace(**r, device_calls=0, kind="step") for r in rows]
    return SimpleNamespace(total=total, rows=rows, by="layer")


def _record(trial, same_graph=True, calls=10, rule="fused-sparse"):
    rows = [
        dict(depth=0, scope="conv", step="SAGEConv", phase="forward", total=0.06),
        dict(depth=0, scope="conv", step="SAGEConv", phase="backward", total=0.04),
    ]
    layer = {"path": "conv", "class": "SAGEConv", "framework": "pyg", "calls": calls}
    layer.update(same_graph=same_graph, options={}, trials={rule: trial})
    return Record(_summary(rows, 0.5), {"layers": [layer]})


class _Scripted:
    """A layer whose copies are named in the order made (stock, then stock again)."""

    made = 0

    def __init__(self, name):
        self.name, self.calls = name, 0

    def __deepcopy__(self, memo):
        _Scripted.made += 1
        return _Scripted("stock" if _Scripted.made == 1 else "stock again")


@pytest.mark.parametrize("faster", [25, 26])
def test_a_saving_is_the_median_of_the_rounds_against_their_faster_stock_call(monkeypatch, faster):
    """50 rounds; the change half a second faster than both stock calls in 25 or 26 of them,
    a second slower in the others: the median of the rounds' savings says which."""
    _Scripted.made = 0

    def timed(layer, inputs):
        layer.calls += 1  # the first call of each is its warm-up
        if layer.name != "changed":
            return [torch.ones(1)], 1.0 + 0.01 * (layer.name == "stock again")
        return [torch.ones(1)], 0.5 if layer.calls - 1 <= faster else 2.0

    monkeypatch.setattr(trials, "forward_backward", timed)
    change = trials.Change("lower-precision", "autocast", ((), {}), layer=_Scripted("changed"))
    t = trials.time_change(_Scripted("user's"), ((), {}), change, 10.0)
    assert (t["rounds"], t["faster_rounds"], t["aa_s"]) == (50, faster, pytest.approx(0.01))
    assert t["paired_saving_s"] == (0.5 if faster == 26 else -0.25)
    assert rules.saves(t) == (faster == 26)


def test_the_rule_advises_a_saving_beyond_the_aa_scaled_to_the_layers_time_less_converting():
    trial = dict(change="pass adj_t", stock_s=0.010, changed_s=0.006, aa_s=0.001)
    trial.update(convert_s=0.002, rounds=9, faster_rounds=9, paired_saving_s=0.004)
    trial.update(difference=1e-7, equal=True)
    (item,) = decide(_record(trial), min_share=0.0)
    assert item["rule"] == "fused-sparse" and item["at_stake_share"] == pytest.approx(0.2)
    # 40% of the layer's 0.1 s, less one conversion (the graph stayed), of 0.5 s recorded
    assert item["measured_saving_share"] == pytest.approx((0.1 * 0.4 - 0.002) / 0.5)
    assert lines([item])[1].startswith("  20% at stake (at most), 8% saved as timed in conv (")
    (item,) = decide(_record(trial, same_graph=False), min_share=0.0)  # converted each call
    assert item["measured_saving_share"] == pytest.approx((0.1 * 0.4 - 0.02) / 0.5)
    older = {k: v for k, v in trial.items() if k != "paired_saving_s"}  # a record by medians
    assert decide(_record(dict(older, changed_s=0.0095)), min_share=0.0) == []  # in the A/A
    assert len(decide(_record(older), min_share=0.0)) == 1
    # faster by the medians, not round by round: noise (a busy machine), not a saving
    assert decide(_record(dict(trial, paired_saving_s=0.0009)), min_share=0.0) == []
    assert len(decide(_record(dict(trial, paired_saving_s=0.0011)), min_share=0.0)) == 1
    assert decide(_record(dict(trial, equal=False)), min_share=0.0) == []
    assert decide(_record(dict(trial, convert_s=0.05)), min_share=0.0) == []  # costs more


@needs_pyg
def test_run_advise_times_the_change_and_saves_what_it_found(tmp_path):
    import json

    from .helpers import ROOT, run_script

    # the model lives in a function, as in most scripts: gone when the script ends, before
    # the changes are timed (run holds the noted layers for them)
    script = tmp_path / "train.py"
    inner = ROOT / "tests" / "scripts" / "transductive_gcn.py"
    script.write_text(
        f"import gc, runpy\n\ndef main():\n    runpy.run_path({str(inner)!r})\n\n"
        "main()\ngc.collect()\n"
    )
    folder = tmp_path / "run"
    run_script(
        "-m", "instrumented_convs", "run", "--advise", "--advise-seconds", "2", "-o",
        str(folder), str(script), cwd=tmp_path,
    )  # fmt: skip
    saved = json.loads((folder / "run.json").read_text())
    timed = {x["path"]: x["trials"]["fused-sparse"] for x in saved["signals"]["layers"]}
    assert set(timed) == {"conv1", "conv2"}
    # its graph has self-loops and repeated edges: GCNConv's sparse path is another model
    # (torch-sparse's SparseTensor, where installed, replaces them as edge_index does)
    assert all(t["equal"] == (t["variant"] == "SparseTensor") for t in timed.values())
    assert all(t["rounds"] >= 3 for t in timed.values())
    folder0 = tmp_path / "none"
    run_script(
        "-m", "instrumented_convs", "run", "--advise", "--advise-seconds", "0", "-o",
        str(folder0), str(ROOT / "tests" / "scripts" / "transductive_gcn.py"), cwd=tmp_path,
    )  # fmt: skip
    saved = json.loads((folder0 / "run.json").read_text())
    assert not [x for x in saved["signals"]["layers"] if "trials" in x]


def test_dgl_weights_normalised_once_are_timed_against_graph_convs_own_norm(advising):
    dgl = pytest.importorskip("dgl")
    from instrumented_convs.dgl import GraphConv

    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 300, (2, 3000), generator=g)
    graph = dgl.add_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=300))
    x = torch.randn(300, 16, generator=g)
    model = GraphConv(16, 8)
    _train(model, graph, x)
    assert trials.measure(2.0) == []
    (rec,) = signals.describe()["layers"]
    t = rec["trials"]["cache-normalization"]
    assert t["equal"] and t["rounds"] >= 3 and "EdgeWeightNorm(norm='both')" in t["change"]
    assert model._norm == "both"  # the user's layer as it was


def _dgl_loop(anew: str, steps: int = 4, n: int = 3000, e: int = 30000):
    """A GraphConv trained ``steps`` times on a graph ``anew``: ``same`` (one graph made
    anew each step, dgl.add_self_loop inside the loop), ``kept`` (made once), ``other`` (a
    graph of its own each step)."""
    dgl = pytest.importorskip("dgl")
    from instrumented_convs.dgl import GraphConv

    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, e), generator=g)
    x = torch.randn(n, 16, generator=g)
    model = GraphConv(16, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = dgl.add_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=n))
    for step in range(steps):
        if anew == "same":
            graph = dgl.add_self_loop(dgl.graph((ei[0], ei[1]), num_nodes=n))
        elif anew == "other":
            src, dst = torch.randint(0, n, (2, e), generator=g)
            graph = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=n))
        else:
            graph = kept
        opt.zero_grad()
        model(graph, x).relu().sum().backward()
        opt.step()
    return model


@pytest.mark.parametrize("anew", ["same", "kept", "other"])
def test_a_graph_made_anew_at_each_call_is_timed_against_one_kept(advising, monkeypatch, anew):
    """The same graph made anew each step: its formats are made in each call; timed against
    one graph kept (the stock calls given a graph made anew each, as the user's were), and
    the saving counted over the calls after the first. One graph kept: not timed; a graph of
    its own each step: timed, never advised (each needs its formats)."""
    pytest.importorskip("dgl")
    from instrumented_convs.dgl import trials as dgl_trials

    made = []
    real = dgl_trials._anew
    monkeypatch.setattr(dgl_trials, "_anew", lambda graph: made.append(1) or real(graph))
    model = _dgl_loop(anew)  # (held: a layer no longer alive is not timed)
    assert trials.measure(3.0) == []
    (rec,) = signals.describe()["layers"]
    assert rec.get("fresh_graph_calls", 0) == (1 if anew == "kept" else 4)
    assert rec.get("graph_remade") == {"same": True, "kept": None, "other": False}[anew]
    t = rec.get("trials", {}).get("graph-formats")
    if anew == "kept":
        assert t is None
        return
    assert t["equal"] and t["rounds"] >= 3 and "create_formats_()" in t["change"]
    # the one kept, then one for each stock call: two warm-ups and two a round
    assert len(made) == 1 + 2 + 2 * t["rounds"]
    # what the rule makes of it, with a saving beyond the A/A (as on an idle machine)
    t = dict(t, stock_s=0.01, changed_s=0.006, paired_saving_s=0.004, aa_s=0.001)
    summary = ic.registry.summary(by="layer")
    items = decide(Record(summary, {"layers": [dict(rec, trials={"graph-formats": t})]}), 0.0)
    items = [i for i in items if i["rule"] == "graph-formats"]
    if anew == "other":  # graphs that differ: each needs its formats made
        assert items == []
        return
    (item,) = items
    layer = sum(r.total for r in summary.rows if r.depth == 0 and r.step == "GraphConv")
    # 40% of the layer's time, in the 3 calls of 4 after the first
    assert item["measured_saving_share"] == pytest.approx(layer * 3 / 4 * 0.4 / summary.total)
    assert "its last two were" in item["valid_when"] and model._norm == "both"


def test_where_dgls_lookup_of_made_formats_is_gone_formats_says_it(advising, monkeypatch):
    pytest.importorskip("dgl")
    from instrumented_convs.dgl import graphconv

    monkeypatch.setattr(graphconv, "_CREATED", None)
    model = _dgl_loop("same", steps=3)
    (rec,) = signals.describe()["layers"]
    assert rec["fresh_graph_calls"] == 3 and rec["graph_remade"] is True
    assert model._norm == "both"


class _Three(torch.nn.Module):
    """A SAGEConv, a GraphConv given edge weights and a GINConv, each 64 wide in, 8 out."""

    def __init__(self, **sage):
        from instrumented_convs.pyg import GINConv, GraphConv, SAGEConv

        super().__init__()
        self.sage, self.graph = SAGEConv(64, 8, **sage), GraphConv(64, 8, aggr="mean")
        self.gin = GINConv(torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.ReLU()))

    def forward(self, x, ei):
        w = torch.linspace(0.5, 1.5, ei.size(1))
        return self.sage(x, ei) + self.graph(x, ei, w) + self.gin(x, ei)


@needs_pyg
def test_projecting_first_is_timed_as_the_same_model_where_the_input_is_wider(advising):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(400, 64, generator=g)
    _, ei = _graph()
    model = _Three(normalize=True)
    _train(model, x, ei)
    assert trials.measure(3.0) == []
    for layer in (model.sage, model.graph, model.gin):
        t = _trial(layer, "project-first")
        assert t["equal"] and t["difference"] <= 1e-5 and t["rounds"] >= 3, type(layer)
        assert "8 wide, not 64" in t["change"]
    signals.clear()
    from instrumented_convs.pyg import SAGEConv

    narrow, maximum = SAGEConv(16, 16), SAGEConv(64, 8, aggr="max")  # not wider; not a sum
    for layer in (narrow, maximum):
        _train(layer, x[:, : layer.lin_l.in_channels], ei)
        assert trials.measure(1.0) == [] and _trial(layer, "project-first") is None
        signals.clear()


@needs_pyg
def test_the_project_first_subclass_in_docs_advice_is_sageconv_projected_first():
    """The class docs/advice.md gives, run against PyG's own SAGEConv with its state_dict."""
    import re

    from torch_geometric.nn import SAGEConv

    from .helpers import ROOT

    text = (ROOT / "docs" / "advice.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "SAGEConvFirst" in b)
    space = {}
    exec(compile(code, "docs/advice.md", "exec"), space)
    _, ei = _graph()
    x = torch.randn(400, 64, generator=torch.Generator().manual_seed(2))
    for options in ({}, {"normalize": True, "aggr": "sum"}, {"root_weight": False}):
        stock = SAGEConv(64, 8, **options)
        first = space["SAGEConvFirst"](64, 8, **options)
        first.load_state_dict(stock.state_dict())
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_a, out_b = stock(a, ei), first(b, ei)
        out_a.square().sum().backward()
        out_b.square().sum().backward()
        assert torch.allclose(out_a, out_b, atol=1e-5), options
        assert torch.allclose(a.grad, b.grad, atol=1e-5)
        assert all(
            torch.allclose(p.grad, q.grad, atol=1e-4)
            for p, q in zip(stock.parameters(), first.parameters())
        )


@needs_pyg
def test_bfloat16_is_timed_against_its_tolerance(advising):
    from instrumented_convs.layers.precision import TOLERANCE

    x = torch.randn(400, 64, generator=torch.Generator().manual_seed(3))
    _, ei = _graph()
    model = _Three()
    _train(model, x, ei)
    assert trials.measure(3.0) == []
    t = _trial(model.sage, "lower-precision")
    assert t["tolerance"] == TOLERANCE and 0 < t["difference"] <= TOLERANCE and t["equal"]
    assert "torch.autocast('cpu', dtype=torch.bfloat16)" in t["change"]
    assert model.sage.lin_l.weight.dtype == torch.float32


@needs_pyg
def test_a_layer_no_graph_rule_names_is_timed_in_bfloat16_and_given_no_graph_advice(advising):
    """GATConv (no fused product, no cached normalisation): its inputs held, bfloat16 timed;
    its self-loops, on every node and with edge features it replaces, advise nothing."""
    from instrumented_convs.pyg import GATConv

    x, ei = _graph()
    ei = torch.cat([ei, torch.arange(400).repeat(2, 1)], dim=1)  # a loop on every node
    attr = torch.randn(ei.size(1), 4, generator=torch.Generator().manual_seed(5))
    model = torch.nn.Sequential()
    model.gat = GATConv(16, 8, heads=2, edge_dim=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model.gat(x, ei, attr).relu().sum().backward()
        opt.step()
    items = ic.advise(seconds=3.0, min_share=0.0)
    t = _trial(model.gat, "lower-precision")
    assert t["rounds"] >= 3 and t["difference"] is not None, t
    assert _trial(model.gat, "fused-sparse") is None
    (rec,) = signals.describe()["layers"]
    assert rec["options"] == {} and rec["self_loop_nodes"] == rec["nodes"] == 400
    # (its add_self_loops step is timed: the rule would advise, were the options read)
    assert ic.registry.summary()["GATConv/add_self_loops"].total > 0
    assert [i["rule"] for i in items if i["rule"] == "self-loops-present"] == []


def test_the_rules_of_a_projection_first_and_of_bfloat16_read_what_was_timed():
    trial = dict(change="project before the sum", stock_s=0.010, changed_s=0.007, aa_s=0.001)
    trial.update(convert_s=0.0, rounds=9, difference=3e-7, tolerance=1e-4, equal=True)
    (item,) = decide(_record(trial, rule="project-first"), min_share=0.0)
    assert item["rule"] == "project-first"
    assert item["measured_saving_share"] == pytest.approx(0.1 * 0.3 / 0.5)
    assert item["outputs"].startswith("equal: the largest difference 3.0e-07")
    low = dict(trial, change="autocast", difference=0.012, tolerance=0.03)
    (item,) = decide(_record(low, rule="lower-precision"), min_share=0.0)
    assert item["rule"] == "lower-precision"
    assert item["outputs"].startswith("different: the largest difference 1.2e-02 of the largest")
    assert "within the 3e-02 taken as the same model" in item["outputs"]
    assert decide(_record(dict(low, equal=False), rule="lower-precision"), min_share=0.0) == []
    slower = dict(low, changed_s=0.012)  # bfloat16 without the instructions for it
    assert decide(_record(slower, rule="lower-precision"), min_share=0.0) == []


@needs_pyg
def test_the_compiled_layer_is_timed_only_when_asked_for_its_compilation_said(
    advising, monkeypatch
):
    """``compile`` (run --advise-compile): a copy given to torch.compile, compiled first (its
    time kept as the change's once-paid cost), then timed as every change."""
    from instrumented_convs.commands.launch import cli
    from instrumented_convs.pyg import SAGEConv

    x, ei = _graph(n=200, e=1000)
    model = SAGEConv(16, 8)
    _train(model, x, ei)
    assert trials.measure(1.0) == [] and _trial(model, "compiled-layer") is None
    assert trials.measure(60.0, compile=True) == []
    t = _trial(model, "compiled-layer")
    assert t["equal"] and t["convert_once"] and t["convert_s"] > 0 and t["rounds"] >= 3
    assert "torch.compile" in t["change"]
    asked = []  # run passes --advise-compile on
    monkeypatch.setattr(
        "instrumented_convs.layers.time_changes", lambda s, compile: asked.append(compile) or []
    )
    cli._time_changes(SimpleNamespace(advise_seconds=1.0, advise_compile=True), 0.0)
    assert asked == [True]


def test_a_compilation_is_counted_once_whatever_the_graph():
    trial = dict(change="torch.compile", stock_s=0.010, changed_s=0.006, aa_s=0.001)
    trial.update(convert_s=0.004, convert_once=True, rounds=9, difference=0.0, equal=True)
    (item,) = decide(_record(trial, same_graph=False, rule="compiled-layer"), min_share=0.0)
    assert item["measured_saving_share"] == pytest.approx((0.1 * 0.4 - 0.004) / 0.5)
    assert "; making it took 4 ms once" in item["why"]
