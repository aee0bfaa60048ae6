"""``instrumented_convs.lightning.ConvProfiler`` with the real Lightning Trainer (CPU): the same
losses as without it, Lightning's actions as regions with the layers' steps under them, counts
exact, a run folder per call, DDP ranks merged; ``run`` on an unmodified Lightning script."""

from __future__ import annotations

import json
import random

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs.core.frames.stack import open_steps
from instrumented_convs.report import Summary

from .helpers import ROOT, counts, integration, run_script

L = integration("lightning")
torchmetrics = integration("torchmetrics")
torch_geometric = pytest.importorskip("torch_geometric")
lightning_ic = integration("instrumented_convs.lightning")  # (ours: an ImportError fails in CI)
ConvProfiler = lightning_ic.ConvProfiler

BATCHES, EPOCHS, LAYERS = 3, 2, 2  # training batches an epoch, epochs, conv layers


class GCN(L.LightningModule):
    """Two stock GCNConv layers and a metric; every training loss kept."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch_geometric.nn.GCNConv(8, 16)
        self.conv2 = torch_geometric.nn.GCNConv(16, 3)
        self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)
        self.losses: list = []

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def training_step(self, batch, i):
        out = self(batch.x, batch.edge_index)
        loss = torch.nn.functional.cross_entropy(out, batch.y)
        self.accuracy(out, batch.y)  # a module call, and no model's forward
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, i):
        self.log("val", self(batch.x, batch.edge_index).sum(), batch_size=1)

    def test_step(self, batch, i):
        self.log("test", self(batch.x, batch.edge_index).sum(), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def _loaders():
    random.seed(0)
    torch.manual_seed(0)
    graphs = torch_geometric.datasets.FakeDataset(
        num_graphs=2 * BATCHES, avg_num_nodes=20, num_channels=8, num_classes=3, task="node"
    )
    loader = torch_geometric.loader.DataLoader
    return loader(graphs, batch_size=2), loader(graphs, batch_size=3)


def _trainer(profiler=None, trainer_cls=None, **kw):
    cls = trainer_cls or L.Trainer
    options = dict(
        max_epochs=EPOCHS,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=1,
        limit_val_batches=1,
    )
    options.update(kw)
    return cls(profiler=profiler, **options)


def _fit(profiler=None, trainer_cls=None, **kw):
    L.seed_everything(0, verbose=False)
    model = GCN()
    train, val = _loaders()
    trainer = _trainer(profiler, trainer_cls, **kw)
    trainer.fit(model, train, val)
    return model, trainer


def test_a_pyg_module_trains_as_without_it_with_lightnings_actions_as_regions(tmp_path):
    stock, _ = _fit()
    call = torch.nn.Module.__call__
    profiler = ConvProfiler(dirpath=tmp_path)
    model, _ = _fit(profiler)
    assert model.losses == stock.losses and len(model.losses) == BATCHES * EPOCHS
    for (k, a), b in zip(model.state_dict().items(), stock.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    # the layers it instrumented are stock again; nothing left open or hooked
    assert type(model.conv1) is torch_geometric.nn.GCNConv and open_steps() == []
    assert torch.nn.Module.__call__ is call
    assert ic.configure().timeline == 0
    run = json.loads((tmp_path / "fit" / "run.json").read_text())
    assert run["lightning"] == {"stage": "fit", "call": 1} and run["ended_by"] == "returned"
    for name in ("page.html", "summary.txt", "trace.json.gz"):
        assert (tmp_path / "fit" / name).stat().st_size > 0
    c = counts(Summary.from_dict(run["summary"]))
    n = BATCHES * EPOCHS
    assert c[("training batch", "forward")] == n
    assert c[("training batch/training_step", "forward")] == n
    assert c[("training batch/training_step/forward", "forward")] == n  # not the metric's
    assert c[("training batch/training_step/forward/GCNConv", "forward")] == n * LAYERS
    assert c[("training batch/training_step/forward/GCNConv/propagate", "forward")] == n * LAYERS
    assert c[("training batch/backward", "forward")] == n
    assert c[("training batch/backward/GCNConv", "backward")] == n * LAYERS
    assert c[("training batch/optimizer.step", "forward")] == n  # the update alone
    assert not [k for k in c if k[0].startswith("training batch/optimizer.step/")]
    assert c[("data", "forward")] == n + EPOCHS  # a fetch a batch, and one for validation
    assert c[("validation_step", "forward")] == EPOCHS
    assert c[("validation_step/forward (no grad)/GCNConv", "forward")] == EPOCHS * LAYERS
    assert c[("validation_step (sanity check)", "forward")] == 1  # marked apart
    assert c[("data (sanity check)", "forward")] == 1
    assert profiler.folders == [tmp_path / "fit"]
    assert "training batch" in profiler.summary() and "GCNConv" in profiler.summary()


def test_a_dgl_module_and_the_duty_cycle_and_switches_as_arguments(tmp_path):
    dgl = pytest.importorskip("dgl")

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            ends = torch.randint(0, 40, (2, 160))
            self.graph = dgl.add_self_loop(dgl.graph((ends[0], ends[1]), num_nodes=40))
            self.x, self.y = torch.randn(40, 8), torch.randint(0, 3, (40,))
            self.conv1 = dgl.nn.GraphConv(8, 16)
            self.conv2 = dgl.nn.GraphConv(16, 3)
            self.losses: list = []

        def training_step(self, idx, i):
            h = self.conv2(self.graph, self.conv1(self.graph, self.x).relu())
            loss = torch.nn.functional.cross_entropy(h[idx], self.y[idx])
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = torch.utils.data.DataLoader(torch.arange(40), batch_size=10)  # 4 batches

    def fit(profiler):
        L.seed_everything(0, verbose=False)
        model = Net()
        _trainer(profiler, max_epochs=3).fit(model, loader)
        return model

    stock = fit(None)
    model = fit(ConvProfiler(dirpath=tmp_path / "full"))
    assert model.losses == stock.losses and type(model.conv1) is dgl.nn.GraphConv
    full = Summary.from_dict(json.loads((tmp_path / "full/fit/run.json").read_text())["summary"])
    c = counts(full)
    assert c[("training batch/training_step/forward/GraphConv", "forward")] == 12 * LAYERS
    assert c[("training batch/training_step/forward/GraphConv/update_all", "forward")] == 24
    assert c[("training batch/backward/GraphConv", "backward")] == 12 * LAYERS
    profiler = ConvProfiler(dirpath=tmp_path, record_every=2, backward_every=1, timeline=0)
    model = fit(profiler)
    assert model.losses == stock.losses and type(model.conv1) is dgl.nn.GraphConv
    run = json.loads((tmp_path / "fit" / "run.json").read_text())
    assert run["settings"]["record_every"] == 2 and run["settings"]["backward_every"] == 1
    assert run["sampling"]["iterations"] == 12 and 3 <= run["sampling"]["recorded"] < 12
    assert not (tmp_path / "fit" / "trace.json.gz").exists()
    assert ic.configure().record_every == 1 and ic.configure().backward_every != 1  # put back
    summary = Summary.from_dict(run["summary"])
    row = summary["training batch/training_step/forward/GraphConv"]  # (the layer's own call)
    assert row.count == 12 * LAYERS and row.sampled  # (the estimate: calls per iteration, exact)
    assert counts(summary)[("training batch/backward/GraphConv", "backward")] == row.count


def test_each_call_has_its_folder_and_validate_and_test_their_regions(tmp_path):
    profiler = ConvProfiler(dirpath=tmp_path, filename="gcn")
    model, trainer = _fit(profiler, max_epochs=1)
    train, val = _loaders()
    trainer.validate(model, val)
    trainer.test(model, val)
    trainer.fit(model, train, val)  # (max_epochs reached: nothing trains)
    names = [p.name for p in profiler.folders]
    assert names == ["gcn-fit", "gcn-validate", "gcn-test", "gcn-fit-2"]
    test = Summary.from_dict(
        json.loads((tmp_path / "gcn-test" / "run.json").read_text())["summary"]
    )
    assert counts(test)[("test_step/forward (no grad)/GCNConv", "forward")] == 2 * LAYERS
    assert "training batch" not in {r.name for r in test}
    # Lightning wrote the table with a filename: the file of each stage holds ours
    assert "test_step" in (tmp_path / "test-gcn.txt").read_text()


def test_the_trainer_of_pytorch_lightning_takes_it_too(tmp_path):
    pl = integration("pytorch_lightning")
    assert isinstance(ConvProfiler(), pl.profilers.Profiler)
    assert isinstance(ConvProfiler(), L.pytorch.profilers.Profiler)

    class PLGCN(pl.LightningModule):  # the same module, of pytorch_lightning
        forward, training_step = GCN.forward, GCN.training_step
        configure_optimizers = GCN.configure_optimizers

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch_geometric.nn.GCNConv(8, 16)
            self.conv2 = torch_geometric.nn.GCNConv(16, 3)
            self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)
            self.losses: list = []

    L.seed_everything(0, verbose=False)
    model = PLGCN()
    train, _ = _loaders()
    profiler = ConvProfiler(dirpath=tmp_path)
    _trainer(profiler, pl.Trainer, max_epochs=1, limit_val_batches=0).fit(model, train)
    c = counts(
        Summary.from_dict(json.loads((tmp_path / "fit" / "run.json").read_text())["summary"])
    )
    assert c[("training batch/training_step/forward/GCNConv", "forward")] == BATCHES * LAYERS


def test_a_training_step_that_raises_saves_what_was_recorded_and_unhooks(tmp_path):
    class Bad(GCN):
        def training_step(self, batch, i):
            if i == 1:
                raise ValueError("a bad batch")
            return super().training_step(batch, i)

    call = torch.nn.Module.__call__
    profiler = ConvProfiler(dirpath=tmp_path)
    L.seed_everything(0, verbose=False)
    train, val = _loaders()
    with pytest.raises(ValueError, match="a bad batch"):
        _trainer(profiler).fit(Bad(), train, val)
    assert torch.nn.Module.__call__ is call and open_steps() == []
    run = json.loads((tmp_path / "fit" / "run.json").read_text())
    assert run["ended_by"] == "raised"
    batch = Summary.from_dict(run["summary"])["training batch"]
    assert batch.count == 2 and batch.errors == 1  # the first, and the one that raised


def test_bad_arguments_are_refused_at_once():
    with pytest.raises(TypeError, match="record_evry"):
        ConvProfiler(record_evry=2)
    with pytest.raises(TypeError, match="collection"):
        ConvProfiler(only="GCNConv")
    with pytest.raises(ValueError, match="not with record_every"):
        ConvProfiler(record="on-demand", record_every=10)
    with pytest.raises(ValueError, match="no warmup"):
        ConvProfiler(record="on-demand", warmup=2)


def test_on_demand_records_only_what_a_capture_asks_for_while_it_fits(tmp_path):
    """``ConvProfiler(record="on-demand")``: the Trainer trains as without it, and the
    ``capture`` command (from a thread, at the second optimizer step) gets exactly the
    steps it asks for, in a folder of the call's."""
    from .test_ondemand import Asked

    stock, _ = _fit(max_epochs=4)

    class Ask(L.Callback):
        asked = None

        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2 and self.asked is None:
                self.asked = Asked(tmp_path / "fit", "--iterations", 3)
                self.asked.armed()

    ask = Ask()
    profiler = ConvProfiler(dirpath=tmp_path, record="on-demand", counters=True)
    model, _ = _fit(profiler, max_epochs=4, callbacks=[ask])
    code, out, err = ask.asked.result()
    assert code == 0 and out == str(tmp_path / "fit" / "capture-1"), err
    assert model.losses == stock.losses
    c = counts(Summary.load(out))
    for path in ("training batch", "training batch/training_step", "training batch/optimizer.step"):
        assert c[(path, "forward")] == 3, (path, c)
    assert c[("training batch/training_step/forward/GCNConv", "forward")] == 3 * LAYERS
    saved = json.loads((tmp_path / "fit" / "capture-1" / "run.json").read_text())
    assert saved["capture"]["complete"] and saved["lightning"]["stage"] == "fit"
    flops = {r.name: r.flops for r in Summary.load(out)}  # the counters, in the capture
    assert flops["training batch/training_step/forward/GCNConv/lin"] > 0
    run = json.loads((tmp_path / "fit" / "run.json").read_text())
    assert [cap["name"] for cap in run["on_demand"]["captures"]] == ["capture-1"]
    assert not list(Summary.load(tmp_path / "fit"))  # nothing recorded outside it
    assert "On demand: nothing is recorded but what a capture asks for" in profiler.summary()
    assert ic.configure().record == "all" and not ic.configure().counters


def test_ddp_two_processes_record_apart_and_rank_0_merges(tmp_path):
    run_script(
        str(ROOT / "tests/scripts/lightning_gcn.py"),
        "--devices",
        "2",
        "--profiler",
        str(tmp_path),
        timeout=300,
    )
    run = json.loads((tmp_path / "fit" / "run.json").read_text())
    assert run["kind"] == "merged" and run["world_size"] == 2 and not run["ranks_missing"]
    assert {p.name for p in (tmp_path / "fit").glob("rank*.json")} == {"rank0.json", "rank1.json"}
    batches = 2 * 2 * 2  # 8 graphs, 2 a batch, over 2 ranks: 2 each an epoch, 2 epochs
    c = counts(Summary.from_dict(run["summary"]))
    assert c[("training batch", "forward")] == batches
    assert c[("training batch/training_step/forward/GCNConv", "forward")] == batches * LAYERS
    assert c[("training batch/backward/GCNConv", "backward")] == batches * LAYERS


def test_run_on_an_unmodified_lightning_script_keeps_forward_and_backward_out_of_the_step(tmp_path):
    plain = run_script(str(ROOT / "tests/scripts/lightning_gcn.py"), timeout=300)
    out = run_script(
        "-m",
        "instrumented_convs",
        "run",
        "--quiet",
        "-o",
        str(tmp_path),
        str(ROOT / "tests/scripts/lightning_gcn.py"),
        timeout=300,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("batch ")]
    assert lines == [x for x in plain.stdout.splitlines() if x.startswith("batch ")]
    run = json.loads((tmp_path / "run.json").read_text())
    c = counts(Summary.from_dict(run["summary"]))
    n = len(lines)
    assert c[("forward", "forward")] == n and c[("forward/GCNConv", "forward")] == n * LAYERS
    assert c[("backward", "forward")] == n and c[("optimizer.step", "forward")] == n
    assert not [k for k in c if k[0].startswith("optimizer.step/")], sorted(c)


def test_the_cost_benchmark_runs_every_variant():
    out = run_script(str(ROOT / "benchmarks/lightning_cost.py"), "--quick", timeout=300)
    lines = out.stdout.splitlines()
    for name in ("no profiler", "Simple", "ConvProfiler", "every=100", "PyTorchProfiler", "again"):
        assert any(name in line for line in lines[2:]), out.stdout


def test_memory_as_a_switch_records_what_each_step_keeps(tmp_path):
    """``ConvProfiler(memory=True)``: configure's switch, on the Trainer's thread, where the
    training step and its backward run; the batch (Lightning's ``data``) is no step's."""
    stock, _ = _fit()
    model, _ = _fit(ConvProfiler(dirpath=tmp_path, memory=True))
    assert model.losses == stock.losses and ic.configure().memory is False
    run = json.loads((tmp_path / "fit" / "run.json").read_text())
    rows = {(r["name"], r["phase"]): r for r in run["summary"]["rows"]}
    conv = rows[("training batch/training_step/forward/GCNConv", "forward")]
    assert conv["saved_bytes"] > 0 and conv["mem_calls"] == conv["count"] == BATCHES * EPOCHS * 2
    assert rows[("data", "forward")]["saved_bytes"] == 0
    assert rows[("training batch/backward/GCNConv", "backward")]["peak_bytes"] > 0
    assert "Saved/call" in (tmp_path / "fit" / "summary.txt").read_text()
