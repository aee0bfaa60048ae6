"""The study: the generated data, the examples end to end, and ``python -m instrumented_convs``."""

from __future__ import annotations

import json
import struct
import sys

import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("dgl")

import instrumented_convs as ic  # noqa: E402
from instrumented_convs import registry  # noqa: E402
from instrumented_convs.commands.study import (  # noqa: E402
    SHAPES,
    DatasetNotFound,
    MissingDependency,
    build_model,
    load_graph,
    synthetic_graph,
    train,
)
from instrumented_convs.commands.study.compare import (  # noqa: E402
    BACKWARD_OF,
    LAYER,
    ROLES,
    backward_role,
    breakdown,
    side_by_side,
)

from .helpers import ROOT, run_script  # noqa: E402

#: ``python -c`` code that runs ``python -m instrumented_convs ARGS`` with torch_sparse and
#: torch_scatter unimportable (``import`` raises ImportError), as where they are not installed:
#: PyG then takes its pure-torch paths.
WITHOUT_SPARSE = (
    "import runpy, sys; sys.modules['torch_sparse'] = sys.modules['torch_scatter'] = None; "
    "sys.argv[0] = 'instrumented_convs'; runpy.run_module('instrumented_convs', "
    "run_name='__main__', alter_sys=True)"
)


def test_generator_is_deterministic_and_has_the_shape():
    a = load_graph("synthetic-cora", seed=3)
    b = load_graph("synthetic-cora", seed=3)
    c = load_graph("synthetic-cora", seed=4)
    for field in ("x", "y", "edge_index", "train_idx", "valid_idx", "test_idx"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.edge_index, c.edge_index)
    shape = SHAPES["synthetic-cora"]
    assert a.num_nodes == shape["num_nodes"] and a.x.size(1) == shape["num_features"]
    assert a.num_edges == shape["num_edges"] == 10_556
    assert (len(a.train_idx), len(a.valid_idx), len(a.test_idx)) == shape["split"]
    ei = a.edge_index
    assert (ei[0] != ei[1]).all()
    keys = ei[0] * a.num_nodes + ei[1]
    assert keys.unique().numel() == keys.numel()
    assert torch.equal(
        torch.sort(keys).values, torch.sort(ei[1] * a.num_nodes + ei[0]).values
    )  # symmetric
    split = torch.cat([a.train_idx, a.valid_idx, a.test_idx])
    assert split.unique().numel() == split.numel()


def test_arxiv_shape_draws_its_directed_edges_then_symmetrises():
    shape = dict(SHAPES["synthetic-arxiv"])
    shape.update(num_nodes=16_934, num_edges=116_624)  # a tenth, same recipe, to keep the test fast
    g = synthetic_graph("tenth-arxiv", **shape)
    assert 116_624 < g.num_edges <= 2 * 116_624
    assert g.x.size(1) == 128 and g.num_classes == 40


@pytest.mark.parametrize("platform", ["pyg", "dgl"])
def test_labels_are_learnable_well_above_chance(platform):
    data = load_graph("synthetic-quick")
    torch.manual_seed(0)
    model, graph = build_model(platform, data, hidden=32)
    result = train(model, data, graph, epochs=30, warmup=0)
    chance = 1 / data.num_classes
    assert result.test_acc > 3 * chance, result
    # the neighbourhood matters: features alone (no edges but self-loops) do worse
    lonely = load_graph("synthetic-quick")
    lonely.edge_index = lonely.edge_index[:, :0]
    torch.manual_seed(0)
    model, graph = build_model(platform, lonely, hidden=32)
    alone = train(model, lonely, graph, epochs=30, warmup=0)
    assert result.test_acc > alone.test_acc + 0.1, (result, alone)


def test_real_dataset_missing_explains_how_to_get_it(tmp_path):
    with pytest.raises(DatasetNotFound, match="pip install ogb"):
        load_graph("ogbn-arxiv", root=str(tmp_path))
    out = run_script(
        "examples/arxiv.py", "--dataset", "ogbn-arxiv", "--root", str(tmp_path), expect=2
    ).stdout
    assert out == ""


@pytest.mark.parametrize(
    "example, platform, rows",
    [
        (
            "examples/arxiv.py",
            "pyg",
            ["gcn_norm", "add_remaining_self_loops", "lin", "propagate", "message", "aggregate"],
        ),
        (
            "examples/arxiv.py",
            "dgl",
            ["zero_in_degree_check", "norm_src", "matmul", "update_all", "norm_dst"],
        ),
        ("examples/cora.py", "pyg", ["gcn_norm", "lin", "propagate"]),
    ],
)
def test_examples_run_end_to_end_and_print_both_tables(example, platform, rows, tmp_path):
    out = run_script(
        example,
        "--platform",
        platform,
        "--quick",
        "--no-progress",
        "--json",
        str(tmp_path / "run.json"),
    ).stdout
    assert "Accuracy: train" in out
    assert "--- Epoch phases" in out and "--- Steps inside forward" in out
    phases = out.split("--- Epoch phases")[1].split("--- Steps inside forward")[0]
    for phase in ("epoch", "forward", "loss", "backward", "optimizer.step"):
        assert f"- {phase} " in phases
    steps = out.split("--- Steps inside forward")[1]
    for row in rows:
        assert f"- {row} " in steps
    payload = json.loads((tmp_path / "run.json").read_text())
    assert payload["platform"] == platform and payload["epochs"] == 3
    assert any(r["name"] == "epoch" and r["count"] == 3 for r in payload["summary"]["rows"])


@pytest.mark.sparse
def test_arxiv_sparse_takes_the_fused_path():
    out = run_script(
        "examples/arxiv.py", "--platform", "pyg", "--sparse", "--quick", "--no-progress"
    ).stdout
    assert "- message_and_aggregate " in out and "- fill_diag " in out and "- message " not in out


def test_aggnet_example_counts_device_to_host_copies():
    out = run_script("examples/aggnet.py", "--quick", "--no-progress").stdout
    assert "device-to-host copies: 9 (3.0 per iteration)" in out
    for region_name in (
        "calculate_delta_value",
        "graph_augmentation",
        "ego_message_passing",
        "augmented_delta",
        "accept",
    ):
        assert f"- {region_name} " in out
    assert "- d2h_copy " in out and "- update_all " in out
    assert "zero_in_degree_check" not in out  # allow_zero_in_degree=True: the layer copies nothing


@pytest.mark.parametrize("script", ["examples/arxiv.py", "examples/cora.py", "examples/aggnet.py"])
def test_help_explains_every_flag(script):
    out = run_script(script, "--help").stdout
    for flag in ("--quick", "--device", "--seed", "--no-progress"):
        assert flag in out
    if "aggnet" not in script:
        for flag in (
            "--platform",
            "--dataset",
            "--root",
            "--hidden-channels",
            "--epochs",
            "--sparse",
        ):
            assert flag in out


def test_compare_command_prints_side_by_side_and_writes_a_png(tmp_path):
    png = tmp_path / "breakdown.png"
    out = run_script(
        "-m",
        "instrumented_convs",
        "compare",
        "--quick",
        "--brief",
        "--no-progress",
        "--plot",
        str(png),
    ).stdout
    assert "PyG (edge_index)" in out and "DGL" in out
    for role in (
        "normalisation",
        "dense transform",
        "sparse aggregation",
        "bias",
        "sparse aggregation (backward)",
        "rest of backward",
    ):
        assert role in out
    assert "ms per epoch" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 300 and height > 200


def _study_summary(platform, backward=True, epochs=2):
    """The summary of a small study run (generated 1,000-node graph, width 16)."""
    ic.configure(backward=backward)
    data = load_graph("synthetic-quick", platform=platform)
    registry.reset()
    torch.manual_seed(0)
    model, graph = build_model(platform, data, hidden=16)
    train(model, data, graph, epochs=epochs, warmup=0)
    return registry.summary()


def _ms(summary, path, phase="forward"):
    """A path's total of one phase in ms per epoch."""
    return (
        sum(r.total for r in summary.rows if r.name == path and r.phase == phase)
        * 1e3
        / summary["epoch"].count
    )


@pytest.mark.parametrize("platform", ["pyg", "dgl"])
def test_breakdown_roles_add_up_to_the_epoch(platform):
    s = _study_summary(platform, epochs=3)
    b = breakdown(s, platform)
    assert b.epochs == 3
    assert b.epoch_ms == pytest.approx(s["epoch"].mean * 1e3)
    assert all(v >= 0 for v in b.per_epoch_ms.values())
    assert b.per_epoch_ms["sparse aggregation"] > 0 and b.per_epoch_ms["dense transform"] > 0
    text = side_by_side([b])
    assert "epoch" in text.splitlines()[-1]


@pytest.mark.parametrize("platform", ["pyg", "dgl"])
def test_breakdown_splits_the_backward_by_role(platform):
    s = _study_summary(platform, backward=True)
    b = breakdown(s, platform)
    per = b.per_epoch_ms
    assert b.backward_split and "backward" not in per
    assert set(BACKWARD_OF) <= set(per)
    for role in (
        "dense transform (backward)",
        "sparse aggregation (backward)",
        "bias (backward)",
        "rest of backward",
    ):
        assert per[role] > 0, role
    assert all(v >= 0 for v in per.values()), per
    # PyG's gcn_norm is not differentiated (the edge weights need no grad); DGL's norms are
    if platform == "pyg":
        assert per["normalisation (backward)"] == 0 and b.steps["normalisation (backward)"] == "-"
    else:
        assert (
            per["normalisation (backward)"] > 0
            and b.steps["normalisation (backward)"] == "norm_src + norm_dst"
        )
    layer = f"epoch/backward/{LAYER[platform]}"
    in_layer = sum(per[backward_role(r)] for r, _ in ROLES) + per["layer glue (backward)"]
    assert in_layer == pytest.approx(_ms(s, layer, "backward"))
    assert sum(per[r] for r in BACKWARD_OF) == pytest.approx(_ms(s, "epoch/backward"))
    assert b.epoch_ms == pytest.approx(s["epoch"].mean * 1e3)
    text = side_by_side([b])
    assert "sparse aggregation (backward)" in text and "rest of backward" in text
    assert "\n  backward " not in text


@pytest.mark.parametrize("platform", ["pyg", "dgl"])
def test_breakdown_without_backward_timing_has_one_backward_role(platform):
    s = _study_summary(platform, backward=False)
    assert not [r for r in s.rows if r.phase == "backward"]
    b = breakdown(s, platform)
    per = b.per_epoch_ms
    assert not b.backward_split
    assert per["backward"] == pytest.approx(_ms(s, "epoch/backward")) and per["backward"] > 0
    assert not set(BACKWARD_OF) & set(per)
    assert b.epoch_ms == pytest.approx(s["epoch"].mean * 1e3)
    assert "\n  backward " in side_by_side([b])


def test_side_by_side_and_plot_take_split_and_unsplit_runs_together(tmp_path):
    pytest.importorskip("matplotlib")
    from instrumented_convs.commands.study.plot import plot

    split = breakdown(_study_summary("dgl", backward=True, epochs=1), "dgl", "split")
    whole = breakdown(_study_summary("pyg", backward=False, epochs=1), "pyg", "whole")
    text = side_by_side([split, whole])
    rows = {line.split("|")[0].strip(): line for line in text.splitlines()[4:-2]}
    assert "backward" in rows and "rest of backward" in rows
    assert rows["rest of backward"].split("|")[2].split()[0] == "0.00"  # the unsplit run lacks it
    png = tmp_path / "mixed.png"
    plot([split, whole], str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_study_uses_only_the_public_face():
    study = ROOT / "instrumented_convs" / "commands" / "study"
    assert list(study.glob("*.py"))
    for path in study.glob("*.py"):
        text = path.read_text()
        for private in (
            "instrumented_convs._",
            "from .._",
            "from ..",
            "import _step",
            "import _layers",
        ):
            assert private not in text, f"{path.name} reaches past the public face: {private!r}"


def test_sparse_input_without_torch_sparse_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_sparse", None)  # import raises ImportError
    with pytest.raises(MissingDependency, match="needs torch-sparse"):
        build_model("pyg", load_graph("synthetic-quick"), hidden=8, sparse=True)


def test_help_lists_every_command():
    out = run_script("-m", "instrumented_convs", "--help").stdout
    listed = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.startswith("    ") and line.split()
    }
    commands = ("demo", "compare", "bench", "run", "view", "merge", "diff")
    assert set(commands) <= set(listed)
    assert all(len(listed[c].split()) > 3 for c in commands)  # each with its line
    assert "seed" not in out.lower()


def test_demo_runs_without_torch_sparse():
    """The first command a user runs needs only pure-Python packages (no torch-sparse/-scatter)."""
    out = run_script("-c", WITHOUT_SPARSE, "demo", "--quick", "--no-progress").stdout
    assert out.count("--- Steps inside forward") == 2  # PyG's and DGL's per-step tables
    for row in ("gcn_norm", "propagate", "norm_src", "update_all"):
        assert f"- {row} " in out
    assert "--- PyG vs DGL, time per epoch by role" in out
    assert "PyG (edge_index)" in out and "SparseTensor" not in out.split("--- PyG vs DGL")[1]
    assert "Next:" in out and "bench" in out.split("Next:")[1]


def test_demo_with_sparse_says_it_needs_torch_sparse():
    proc = run_script(
        "-c", WITHOUT_SPARSE, "demo", "--quick", "--with-sparse", "--no-progress", expect=2
    )
    assert "needs torch-sparse" in proc.stderr and "pip install" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("sparse", [False, pytest.param(True, marks=pytest.mark.sparse)])
def test_bench_command_reports_ratios_and_the_noise_floor(tmp_path, sparse):
    out_json = tmp_path / "bench.json"
    out = run_script(
        *(["-m", "instrumented_convs"] if sparse else ["-c", WITHOUT_SPARSE]),
        "bench",
        "--quick",
        "--cases",
        "DGL",
        "PyG SparseTensor",
        "--json",
        str(out_json),
    ).stdout
    assert "stock vs instrumented" in out and "enabled/stock" in out and "again/stock" in out
    assert "noise floor" in out
    results = json.loads(out_json.read_text())["results"]
    assert "DGL" in {r["case"] for r in results}
    assert ("PyG SparseTensor" in {r["case"] for r in results}) == sparse
    assert ("skipped: needs torch-sparse" in out) != sparse
    for r in results:
        assert set(r["median_s"]) == {"stock", "enabled", "no backward", "disabled", "stock again"}


def test_roofline_example_counts_every_setup_and_lists_dgls_kernels():
    out = run_script("examples/roofline.py", "--dataset", "synthetic-quick", "--epochs", "1").stdout
    assert "--- PyG, edge_index: counters, times from a run without them" in out
    assert "--- DGL: counters, times from a run without them" in out
    for row in ("- lin ", "- aggregate ", "- GraphConv "):
        assert row in out
    assert "x roof" in out and "Roof: the time at the machine's limit" in out
    # DGL's fused kernel runs outside torch's dispatcher: counted from its arguments; every
    # other op of the three setups has a formula but DGL's degree queries (its C library),
    # listed by name under the table, never counted as zero
    assert "- update_all " in out
    unknown = sorted(line for line in out.splitlines() if "no formula" in line)
    assert unknown == [
        "epoch/forward/GraphConv/norm_dst/degrees: no formula for dgl.in_degrees x3 "
        "(not in its FLOP and bytes)",
        "epoch/forward/GraphConv/norm_src/degrees: no formula for dgl.out_degrees x3 "
        "(not in its FLOP and bytes)",
        "epoch/forward/GraphConv/zero_in_degree_check: no formula for dgl.in_degrees x3 "
        "(not in its FLOP and bytes)",
    ], unknown
