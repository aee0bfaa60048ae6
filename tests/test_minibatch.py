"""Mini-batch training: the products shape, DGL blocks, both loaders, the examples, and DDP."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torch_geometric")
pytest.importorskip("dgl")

import torch_geometric.typing as pyg_typing  # noqa: E402

from instrumented_convs.commands.study import (  # noqa: E402
    SHAPES,
    build_model,
    scaled_shape,
    synthetic_graph,
)
from instrumented_convs.commands.study.data import MissingDependency  # noqa: E402
from instrumented_convs.commands.study.minibatch import make_loader, setup  # noqa: E402
from instrumented_convs.commands.study.sharding import require_pyg_sampler, shard  # noqa: E402
from instrumented_convs.report import Summary  # noqa: E402

from .helpers import run_script, run_torchrun  # noqa: E402

#: ``python -c`` code that runs ``examples/minibatch.py ARGS`` with neither pyg-lib nor
#: torch-sparse importable, as where they are not installed: PyG then has no sampler.
WITHOUT_SAMPLER = (
    "import runpy, sys; sys.modules['torch_sparse'] = sys.modules['torch_scatter'] = "
    "sys.modules['pyg_lib'] = None; "
    "sys.argv = ['examples/minibatch.py'] + sys.argv[1:]; runpy.run_path('examples/minibatch.py', "
    "run_name='__main__')"
)

#: Rows every mini-batch table has, besides the layers' steps.
PHASES = ("epoch", "sample", "to_device", "forward", "loss", "backward", "optimizer.step")
LAYER_STEPS = {
    "pyg": ("GCNConv", "gcn_norm", "lin", "propagate", "aggregate"),
    "dgl": ("GraphConv", "norm_src", "matmul", "update_all", "norm_dst"),
}
#: PyG's NeighborLoader needs pyg-lib or torch-sparse; pyg-lib is not on PyPI, so these tests
#: need torch-sparse: the ``sparse`` mark (conftest.py skips them, visibly, without it).
needs_pyg_sampler = pytest.mark.sparse


def test_products_shape_and_its_scaled_copies():
    full = SHAPES["synthetic-products"]
    assert (full["num_nodes"], full["num_edges"], full["num_features"], full["num_classes"]) == (
        2_449_029,
        123_718_280,
        100,
        47,
    )
    assert full["symmetric_count"] and full["split"] == (196_615, 39_323, 2_213_091)
    assert scaled_shape("synthetic-products", 1) == full
    small = scaled_shape("synthetic-products", 0.01)
    assert (small["num_nodes"], small["num_edges"], small["split"]) == (
        24_490,
        1_237_182,
        (1_966, 393, 22_131),
    )
    assert SHAPES["synthetic-products"] == full  # not modified
    tiny = scaled_shape("synthetic-products", 1e-6)  # the minimum sizes, still a valid shape
    assert tiny["num_nodes"] == 64 and min(tiny["split"]) >= 4 and sum(tiny["split"]) <= 64
    assert tiny["num_edges"] <= 64 * 63 // 4 and tiny["num_edges"] % 2 == 0
    with pytest.raises(ValueError):
        scaled_shape("synthetic-products", 0)
    with pytest.raises(ValueError):
        scaled_shape("no-such-shape", 0.5)


def test_scaled_products_graph_is_deterministic_and_has_the_shape():
    shape = scaled_shape("synthetic-products", 0.001)
    a, b = synthetic_graph("p", seed=1, **shape), synthetic_graph("p", seed=1, **shape)
    assert (
        torch.equal(a.edge_index, b.edge_index)
        and torch.equal(a.x, b.x)
        and torch.equal(a.train_idx, b.train_idx)
    )
    assert (
        a.num_nodes == shape["num_nodes"] and a.num_edges == shape["num_edges"]
    )  # directed, symmetric
    assert (len(a.train_idx), len(a.valid_idx), len(a.test_idx)) == shape["split"]
    assert a.x.size(1) == 100 and a.num_classes == 47


def test_shard_gives_every_rank_as_many_nodes():
    nodes = torch.arange(10)
    parts = [shard(nodes, r, 3) for r in range(3)]
    assert [len(p) for p in parts] == [4, 4, 4]  # 10 nodes padded to 12
    assert set(torch.cat(parts).tolist()) == set(range(10))
    assert [len(shard(torch.arange(2), r, 4)) for r in range(4)] == [
        1,
        1,
        1,
        1,
    ]  # fewer nodes than ranks


@pytest.fixture(scope="module")
def small_graph():
    return synthetic_graph("small", seed=0, **scaled_shape("synthetic-products", 0.001))


def test_dgl_model_on_blocks_is_the_layers_called_by_hand(small_graph):
    torch.manual_seed(0)
    net, graph = build_model("dgl", small_graph, hidden=16)
    s = setup("dgl", small_graph, fanouts=(2, 4, 8), batch_size=32, hidden=16)
    _, _, blocks = next(iter(make_loader(s, small_graph.train_idx[:32], train=False)))
    # fanouts go from the seeds outward: the last block (seeds) has the smallest fanout
    assert [int(b.in_degrees().max()) for b in blocks] == [8, 4, 2]
    assert all(int(b.in_degrees().min()) >= 1 for b in blocks)  # self-loops: no zero in-degree
    x = blocks[0].srcdata["feat"]
    h = torch.relu(net.convs[0](blocks[0], x))
    h = torch.relu(net.convs[1](blocks[1], h))
    expected = torch.log_softmax(net.convs[2](blocks[2], h), dim=-1)
    out = net(x, blocks)
    assert out.shape == (32, 47) and torch.allclose(out, expected)
    assert torch.allclose(net(x, tuple(blocks)), expected)
    full = net(small_graph.x, graph)  # the full graph: unchanged
    h = torch.relu(net.convs[1](graph, torch.relu(net.convs[0](graph, small_graph.x))))
    assert torch.allclose(full, torch.log_softmax(net.convs[2](graph, h), dim=-1))
    with pytest.raises(ValueError, match="3 blocks"):
        net(x, blocks[:2])


@needs_pyg_sampler
def test_pyg_loader_samples_the_fanouts_from_the_seeds(small_graph):
    s = setup("pyg", small_graph, fanouts=(2, 4, 8), batch_size=32, hidden=16)
    batch = next(iter(make_loader(s, small_graph.train_idx, train=True)))
    seeds_in = torch.bincount(batch.edge_index[1], minlength=batch.num_nodes)[: batch.batch_size]
    assert (
        batch.batch_size == 32 and 1 <= int(seeds_in.max()) <= 2
    )  # the first fanout is the seeds'
    assert s.net(batch.x, batch.edge_index)[: batch.batch_size].shape == (32, 47)


def test_require_pyg_sampler_says_what_to_install(monkeypatch):
    monkeypatch.setattr(pyg_typing, "WITH_PYG_LIB", False)
    monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", False)
    with pytest.raises(MissingDependency, match="pyg-lib or torch-sparse"):
        require_pyg_sampler()


def test_minibatch_example_without_a_sampler_says_what_is_missing():
    proc = run_script("-c", WITHOUT_SAMPLER, "--quick", "--no-progress", expect=2)
    assert "pyg-lib or torch-sparse" in proc.stderr and "pip install" in proc.stderr
    assert "--platform dgl" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def _rows(summary: Summary) -> dict:
    return {(r.name, r.phase): r for r in summary.rows}


@pytest.mark.parametrize("platform", [pytest.param("pyg", marks=needs_pyg_sampler), "dgl"])
def test_minibatch_example_times_the_loader_next_to_the_layers(platform, tmp_path):
    out = run_script(
        "examples/minibatch.py",
        "--platform",
        platform,
        "--quick",
        "--no-progress",
        "--json",
        str(tmp_path / "run.json"),
        timeout=300,
    ).stdout
    assert "Test accuracy" in out and "final loss" in out and "--- Mini-batch training" in out
    for row in PHASES + LAYER_STEPS[platform]:
        assert f"- {row} " in out, row
    assert "[backward]" in out
    payload = json.loads((tmp_path / "run.json").read_text())
    assert (
        payload["platform"] == platform
        and payload["epochs"] == 2
        and payload["fanouts"] == [15, 10, 5]
    )
    rows = _rows(Summary.from_dict(payload["summary"]))
    batches = 2 * payload["batches"]  # 197 training nodes in batches of 64: 4 per epoch
    assert payload["batches"] == 4 and rows[("epoch", "forward")].count == 2
    for phase in PHASES[1:]:
        assert rows[(f"epoch/{phase}", "forward")].count == batches, phase
    assert 0 <= payload["test_acc"] <= 1 and payload["test_nodes"] == 500


@pytest.mark.parametrize("platform", [pytest.param("pyg", marks=needs_pyg_sampler), "dgl"])
def test_ddp_example_merges_the_ranks(platform, tmp_path):
    path = tmp_path / "merged.json"
    out = run_torchrun(
        "examples/ddp.py", "--platform", platform, "--quick", "--no-progress", "--json", str(path)
    ).stdout
    assert "Slowest" in out and "Spread" in out and "2 ranks merged" in out
    assert "rank 0: epochs" in out and "rank 1: epochs" in out
    assert "2 batches per epoch per rank, 2 ranks (DistributedDataParallel)" in out
    merged = Summary.from_json(path.read_text())
    parts = merged.by_rank()
    assert merged.world_size == len(parts) == 2
    for name in ("epoch", "epoch/sample", "epoch/to_device", "epoch/forward", "epoch/backward"):
        counts = [part[name].count for part in parts]
        assert merged[name].count == sum(counts) and counts[0] == counts[1], name
    assert parts[0]["epoch/forward"].count == 4  # 197 nodes: 99 per rank, batches of 64, 2 epochs
    assert merged["epoch"].slowest is not None and merged["epoch"].spread >= 1


def test_help_explains_the_flags_and_ddp_says_how_to_start_it():
    for script in ("examples/minibatch.py", "examples/ddp.py"):
        out = run_script(script, "--help").stdout
        for flag in (
            "--platform",
            "--scale",
            "--epochs",
            "--batch-size",
            "--fanouts",
            "--device",
            "--seed",
            "--quick",
            "--no-progress",
            "--json",
            "--num-workers",
        ):
            assert flag in out, (script, flag)
    proc = run_script("examples/ddp.py", "--quick", expect=2)  # not under torchrun
    assert "torchrun --nproc-per-node 2 examples/ddp.py" in proc.stderr and proc.stdout == ""
