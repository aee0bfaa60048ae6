"""TensorBoard: ``Summary.to_tensorboard``, ``run --tensorboard DIR`` and the Lightning
profiler's points, read back from the event files with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs.report.tensorboard import tag_of

from .helpers import ROOT, integration, run_script

integration("tensorboard")
event_accumulator = integration("tensorboard.backend.event_processing.event_accumulator")
torch_geometric = pytest.importorskip("torch_geometric")


def _scalars(folder):
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}, acc


def test_each_point_is_the_time_per_call_since_the_writers_previous_one(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from instrumented_convs.pyg import GCNConv

    conv = GCNConv(4, 8)
    x, edge_index = torch.randn(10, 4), torch.randint(0, 10, (2, 30))
    writer = SummaryWriter(str(tmp_path))
    summaries = []
    for epoch, calls in enumerate((2, 3)):
        for _ in range(calls):
            with ic.region("forward (no grad)"):
                conv(x, edge_index).sum().backward()
        summaries.append(ic.registry.summary())
        assert summaries[-1].to_tensorboard(writer, step=epoch) > 0
    with ic.region("other"):  # a row of its own: the next point has it alone
        pass
    ic.registry.summary().to_tensorboard(writer, step=2)
    writer.close()
    got, _ = _scalars(tmp_path)
    first, second = summaries
    for path, phase in [
        ("forward (no grad)/GCNConv/propagate", "forward"),
        ("forward (no grad)/GCNConv/lin", "backward"),
    ]:
        a = next(r for r in first if r.name == path and r.phase == phase)
        b = next(r for r in second if r.name == path and r.phase == phase)
        tag = tag_of("time", path, phase)
        expect = [1e3 * a.total / a.count, 1e3 * (b.total - a.total) / (b.count - a.count)]
        assert [s for s, _ in got[tag]] == [0, 1]  # none at 2: no call since
        assert [v for _, v in got[tag]] == pytest.approx(expect, rel=1e-5)
        assert [v for _, v in got[tag_of("calls", path, phase)]] == [2, 3]
    assert tag_of("time", "forward (no grad)/GCNConv/lin", "backward") == (
        "instrumented_convs_ms_per_call/forward_no_grad/GCNConv/lin.backward"
    )
    assert [s for s, _ in got[tag_of("time", "other")]] == [2]


def test_with_the_counters_the_achieved_flops_and_bytes_and_a_reset_starts_again(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from instrumented_convs.pyg import GCNConv

    conv = GCNConv(16, 16)
    x, edge_index = torch.randn(50, 16), torch.randint(0, 50, (2, 200))
    writer = SummaryWriter(str(tmp_path))
    with ic.configure(counters=True):
        for step in range(2):
            for _ in range(3 - step):
                conv(x, edge_index)
            summary = ic.registry.summary()
            summary.to_tensorboard(writer, step=step)
            ic.registry.reset()  # fewer calls than before: counted from the reset
    writer.close()
    got, _ = _scalars(tmp_path)
    lin = summary["GCNConv/lin"]
    flops = got[tag_of("flops", "GCNConv/lin")]
    assert [s for s, _ in flops] == [0, 1]
    assert flops[1][1] == pytest.approx(lin.flops / lin.total / 1e9, rel=1e-5)
    assert [v for _, v in got[tag_of("calls", "GCNConv/lin")]] == [3, 2]
    assert tag_of("bytes", "GCNConv/lin") in got


def test_run_writes_a_point_an_epoch_and_names_its_run_folder(tmp_path):
    run_script(
        "-m",
        "instrumented_convs",
        "run",
        "--quiet",
        "--tensorboard",
        str(tmp_path / "tb"),
        "-o",
        str(tmp_path / "run"),
        str(ROOT / "tests/scripts/plain_pyg.py"),
        "--epochs",
        "3",
    )
    got, acc = _scalars(tmp_path / "tb")
    # three full-batch epochs (an optimizer step each), then one pass over a data loader
    assert [s for s, _ in got[tag_of("calls", "forward/GCNConv")]] == [1, 2, 3]
    assert [s for s, _ in got[tag_of("calls", "data")]] == [4]
    assert [v for _, v in got[tag_of("calls", "forward/GINConv")]] == [3]  # 3 batches
    text = acc.Tensors("instrumented_convs/run folder/text_summary")[0]
    assert str(tmp_path / "run") in text.tensor_proto.string_val[0].decode()


def test_lightning_points_go_to_the_trainers_own_tensorboard_logger(tmp_path):
    L = integration("lightning")
    from instrumented_convs.lightning import ConvProfiler

    from .test_lightning import BATCHES, EPOCHS, GCN, _loaders, _trainer

    L.seed_everything(0, verbose=False)
    logger = L.pytorch.loggers.TensorBoardLogger(str(tmp_path), name="tb", version=0)
    train, val = _loaders()
    trainer = _trainer(ConvProfiler(dirpath=tmp_path / "runs"), logger=logger)
    trainer.fit(GCN(), train, val)
    got, _ = _scalars(tmp_path / "tb" / "version_0")
    tag = tag_of("calls", "training batch/training_step/forward/GCNConv")
    assert got[tag] == [(BATCHES * (e + 1), 2 * BATCHES) for e in range(EPOCHS)]
    assert "epoch" in got  # Lightning's own, beside ours
