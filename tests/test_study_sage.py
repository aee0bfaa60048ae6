"""The study's GraphSAGE model: ``--model sage``, ``examples/sage.py`` and its role breakdown."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("dgl")

import instrumented_convs as ic  # noqa: E402
from instrumented_convs import registry  # noqa: E402
from instrumented_convs.commands.study import build_model, load_graph, train  # noqa: E402
from instrumented_convs.commands.study.compare import (  # noqa: E402
    BACKWARD_OF,
    LAYER,
    MODEL_LAYER,
    MODEL_ROLES,
    ROLES,
    backward_role,
    breakdown,
    side_by_side,
)

from .helpers import run_script  # noqa: E402

#: Each framework's SAGEConv steps in the dense transform role.
DENSE = {"pyg": "lin_l + lin_r", "dgl": "fc_neigh + fc_self"}
SPARSE = {"pyg": "propagate", "dgl": "update_all"}


def _sage_summary(platform: str, epochs: int = 3, backward: bool = True):
    """The summary of a short GraphSAGE study run (generated 1,000-node graph, width 16)."""
    ic.configure(backward=backward)
    data = load_graph("synthetic-quick", platform=platform)
    registry.reset()
    torch.manual_seed(0)
    model, graph = build_model(platform, data, hidden=16, model="sage")
    train(model, data, graph, epochs=epochs, warmup=0)
    return registry.summary()


def _ms(summary, path, phase="forward"):
    """A path's total of one phase in ms per epoch."""
    return (
        sum(r.total for r in summary.rows if r.name == path and r.phase == phase)
        * 1e3
        / summary["epoch"].count
    )


def test_sage_example_prints_both_frameworks_side_by_side():
    out = run_script("examples/sage.py", "--quick", "--no-progress").stdout
    assert "pyg, 3-layer GraphSAGE:" in out and "dgl, 3-layer GraphSAGE:" in out  # both reports
    table = out.split("--- PyG vs DGL, 3-layer GraphSAGE, time per epoch by role")[1]
    lines = table.splitlines()
    assert "PyG (edge_index)" in lines[1] and "DGL" in lines[1]
    rows = {line.split("|")[0].strip(): line for line in lines[4:] if "|" in line}
    assert DENSE["pyg"] in rows["dense transform"] and DENSE["dgl"] in rows["dense transform"]
    assert "propagate" in rows["sparse aggregation"] and "update_all" in rows["sparse aggregation"]
    assert "feat_drop" in rows["layer glue"]  # DGL's dropout step (p=0) has no role: it is glue
    for role in (
        "sparse aggregation (backward)",
        "rest of forward",
        "rest of backward",
        "optimizer.step",
    ):
        assert role in rows, role
    # SAGEConv has no normalisation or bias step: those roles read 0 for both, so are left out
    assert "normalisation" not in rows and "bias" not in rows
    assert "PyG (edge_index):" in out and "DGL:" in out and "ms per epoch" in out


@pytest.mark.parametrize("platform", ["pyg", "dgl"])
def test_sage_breakdown_roles_add_up_to_the_epoch(platform):
    s = _sage_summary(platform)
    b = breakdown(s, platform, model="sage")
    per = b.per_epoch_ms
    assert b.epochs == 3 and b.model == "sage" and b.backward_split
    assert b.epoch_ms == pytest.approx(s["epoch"].mean * 1e3)
    assert all(v >= 0 for v in per.values()), per
    assert per["dense transform"] > 0 and per["sparse aggregation"] > 0
    assert per["normalisation"] == 0 and per["bias"] == 0
    assert (
        b.steps["dense transform"] == DENSE[platform]
        and b.steps["sparse aggregation"] == SPARSE[platform]
    )
    for phase, name in (("forward", lambda r: r), ("backward", backward_role)):
        layer = f"epoch/{phase}/SAGEConv"
        in_layer = sum(per[name(r)] for r, _ in MODEL_ROLES["sage"]) + per[name("layer glue")]
        assert in_layer == pytest.approx(_ms(s, layer, phase))
    assert per["dense transform (backward)"] > 0 and per["sparse aggregation (backward)"] > 0
    assert sum(per[r] for r in BACKWARD_OF) == pytest.approx(_ms(s, "epoch/backward"))
    text = side_by_side([b])
    assert (
        text.startswith("--- PyG vs DGL, 3-layer GraphSAGE,") and "epoch" in text.splitlines()[-1]
    )


def test_sage_breakdown_without_backward_timing_has_one_backward_role():
    s = _sage_summary("dgl", epochs=2, backward=False)
    b = breakdown(s, "dgl", model="sage")
    assert not b.backward_split and b.per_epoch_ms["backward"] == pytest.approx(
        _ms(s, "epoch/backward")
    )
    assert b.epoch_ms == pytest.approx(s["epoch"].mean * 1e3)


@pytest.mark.parametrize("platform", ["pyg", "dgl"])
def test_sage_stock_and_instrumented_models_share_weights_and_outputs(platform):
    data = load_graph("synthetic-quick", platform=platform)
    torch.manual_seed(0)
    ours, graph = build_model(platform, data, hidden=8, model="sage")
    stock, _ = build_model(platform, data, hidden=8, model="sage", stock=True)
    stock.load_state_dict(ours.state_dict())
    assert type(ours.convs[0]).__name__ == type(stock.convs[0]).__name__ == "SAGEConv"
    assert type(ours.convs[0]) is not type(stock.convs[0])
    torch.testing.assert_close(ours(data.x, graph), stock(data.x, graph))


def test_unknown_model_is_refused_and_gcn_tables_stay():
    data = load_graph("synthetic-quick")
    with pytest.raises(ValueError, match="model must be one of"):
        build_model("pyg", data, hidden=8, model="gat")
    with pytest.raises(ValueError, match="model must be one of"):
        breakdown(_sage_summary("pyg", epochs=1), "pyg", model="gat")
    assert MODEL_ROLES["gcn"] is ROLES and MODEL_LAYER["gcn"] is LAYER
