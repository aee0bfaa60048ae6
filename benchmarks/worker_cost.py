"""What recording a data loader's worker processes costs (issue 42), side by side.

1. **In a worker**, per batch: a worker's recorded batch is the region ``batch`` opened when
   it takes the task, the sampler's steps, and a frame written before the batch goes back
   (a registry snapshot, its new timeline calls, one pickle, one ``write``). Measured here
   in one process on the worker's own code path (``workers.process``'s log and the
   sampler's steps), around real neighbour sampling of a generated graph (DGL's
   ``NeighborSampler``, or PyG's ``NeighborLoader`` where torch-sparse or pyg-lib is
   installed), against the same sampling stock: variants interleaved, the order reversed
   every other round, medians of per-round ratios, and a second stock variant as the A/A
   noise floor; and the recording's own calls timed alone (a batch's region, one sampler
   step, its frame), the figure that sampling's noise does not blur. The goal: at most 5%
   of a worker's sampling time.
2. **In the training process**: a torch ``DataLoader`` with cheap items, the training
   process's own CPU time per batch over a pass (``time.process_time``: its threads, not
   the workers'), stock against recorded (a :class:`~instrumented_convs.workers.Recorder`
   installed, its workers recording), and stock again: with no workers (what the
   recorder's own calls add to a batch, the loader's work aside) and with 2 worker
   processes ahead of the loop (their batches waiting). The goal: nothing measurable
   beyond the A/A floor.

    python benchmarks/worker_cost.py                    # DGL, 15 rounds
    python benchmarks/worker_cost.py --platform pyg     # needs torch-sparse or pyg-lib
    python benchmarks/worker_cost.py --quick            # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_bound as lb  # noqa: E402  (its interleaving of variants)

from instrumented_convs import configure, registry  # noqa: E402
from instrumented_convs.commands.study.data import scaled_shape, synthetic_graph  # noqa: E402
from instrumented_convs.core.steps.step import Step  # noqa: E402
from instrumented_convs.core.storage import timeline as core_timeline  # noqa: E402
from instrumented_convs.workers import Recorder, process, samplers  # noqa: E402


def sampler(platform: str, scale: float, batch: int) -> Callable[[int], Any]:
    """``make(i)``: the i-th batch of seed nodes sampled (15, 10, 5 neighbours a hop)."""
    shape = scaled_shape("synthetic-products", scale)
    data = synthetic_graph("products", **shape)
    seeds = data.train_idx
    n = max(1, seeds.numel() // batch)
    if platform == "dgl":
        import dgl

        g = dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=data.x.size(0))
        g.ndata["feat"], g.ndata["label"] = data.x, data.y
        s = dgl.dataloading.NeighborSampler([5, 10, 15])

        def make(i: int) -> Any:
            return s.sample(g, seeds[(i % n) * batch : (i % n + 1) * batch])

        return make
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    graph = Data(x=data.x, y=data.y, edge_index=data.edge_index)
    loader = NeighborLoader(graph, num_neighbors=[15, 10, 5], batch_size=batch, input_nodes=seeds)

    def make(i: int) -> Any:
        j = i % n
        return loader.collate_fn(list(range(j * batch, (j + 1) * batch)))

    return make


def in_worker(make: Callable[[int], Any], rounds: int, batches: int) -> Dict[str, Any]:
    """Stock sampling against the worker's recorded path, per batch."""
    folder = tempfile.mkdtemp(prefix="worker-cost-")
    config = process.Config(folder, timeline=200_000)

    def stock() -> float:
        t0 = time.perf_counter()
        for i in range(batches):
            make(i)
        return time.perf_counter() - t0

    def recorded() -> float:
        with configure(timeline=config.timeline):
            log = process._Log(config, 0, 1)
            remove = samplers.install()
            try:
                t0 = time.perf_counter()
                for i in range(batches):
                    log.begin(i)
                    data = make(i)
                    log.end(i, data)
                return time.perf_counter() - t0
            finally:
                remove()
                log.writer.close()
                registry.reset()

    variants = {"stock": stock, "recorded": recorded, "stock again": stock}
    got = lb._interleave(variants, rounds, 0)
    frame = os.path.getsize(next(iter(sorted(os.scandir(folder), key=lambda e: e.name))).path)
    base = statistics.median(got["stock"]) / batches
    own = own_cost(config, make(0))
    return {
        "stock_ms_per_batch": round(base * 1e3, 3),
        "own_us_per_batch": round(own * 1e6, 2),
        "own_share": round(own / base, 5),
        "ratios": _ratios(got),
        "added_us_per_batch": round(
            statistics.median(r - s for r, s in zip(got["recorded"], got["stock"])) / batches * 1e6,
            1,
        ),
        "frames_bytes_per_batch": round(frame / (batches * rounds), 1),
    }


def own_cost(config: process.Config, data: Any, n: int = 2000) -> float:
    """Seconds a batch of the recording's own calls, timed alone (medians of 5 runs of
    ``n``): the region's open and close, a frame written (its snapshot, its new calls),
    and one sampler step around nothing: what a worker adds to each batch, without the
    sampling's noise."""
    step = Step("sample", None, "cpu", "step")
    runs = []
    with configure(timeline=config.timeline):
        log = process._Log(config, 0, 1)
        try:
            for _ in range(5):
                t0 = time.perf_counter()
                for i in range(n):
                    log.begin(i)
                    with step:
                        pass
                    log.end(i, data)
                runs.append((time.perf_counter() - t0) / n)
                registry.reset()
        finally:
            log.writer.close()
    return statistics.median(runs)


class Items(torch.utils.data.Dataset):
    """Cheap items: the workers stay ahead of the loop."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i))


def in_training(rounds: int, workers: int) -> Dict[str, Any]:
    """A pass over a loader, stock against recorded: this process's CPU time per batch."""

    def make_pass(record: bool) -> Callable[[], float]:
        def one() -> float:
            rec = Recorder(region=None).install() if record else None
            try:
                extra = dict(multiprocessing_context="fork") if workers else {}
                loader = torch.utils.data.DataLoader(
                    Items(), batch_size=4, num_workers=workers, **extra
                )
                it = iter(loader)
                first = next(it)  # the workers started and ahead
                time.sleep(0.05)
                t0 = time.process_time()  # this process's CPU: not the workers'
                n = 1
                for _ in it:
                    n += 1
                dt = time.process_time() - t0
                del first, it
                return dt / (n - 1)
            finally:
                if rec is not None:
                    rec.close()

        return one

    variants = {
        "stock": make_pass(False),
        "recorded": make_pass(True),
        "stock again": make_pass(False),
    }
    got = lb._interleave(variants, rounds, 0)
    med = {k: statistics.median(v) * 1e6 for k, v in got.items()}
    return {
        "workers": workers,
        "stock_cpu_us_per_batch": round(med["stock"], 2),
        "recorded_cpu_us_per_batch": round(med["recorded"], 2),
        "added_us_per_batch": round(med["recorded"] - med["stock"], 2),
        "aa_us_per_batch": round(med["stock again"] - med["stock"], 2),
        "ratios": _ratios(got),
    }


def _ratios(got: Dict[str, List[float]]) -> Dict[str, float]:
    return {
        k: round(statistics.median(v / s for v, s in zip(got[k], got["stock"])), 4)
        for k in got
        if k != "stock"
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--platform", choices=("dgl", "pyg"), default="dgl")
    p.add_argument("--scale", type=float, default=0.01, help="of ogbn-products' shape")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--batches", type=int, default=10, help="per round and variant")
    p.add_argument("--quick", action="store_true", help="a smoke run")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args()
    if a.quick:
        a.scale, a.rounds, a.batches, a.batch_size = 0.002, 2, 2, 256
    torch.set_num_threads(1)
    core_timeline.set_limit(0)
    result = {
        "platform": a.platform,
        "scale": a.scale,
        "batch_size": a.batch_size,
        "rounds": a.rounds,
        "worker": in_worker(sampler(a.platform, a.scale, a.batch_size), a.rounds, a.batches),
        "training": [in_training(a.rounds, 0), in_training(a.rounds, 2)],
    }
    w = result["worker"]
    print(
        f"in a worker ({a.platform} sampling, {w['stock_ms_per_batch']} ms a batch): recorded / "
        f"stock {w['ratios']['recorded']:.4f} (A/A {w['ratios']['stock again']:.4f}); the "
        f"recording's own calls {w['own_us_per_batch']} us a batch ({w['own_share']:.3%} of "
        f"the sampling), {w['frames_bytes_per_batch']} B of frames a batch"
    )
    for t in result["training"]:
        print(
            f"in the training process ({t['workers']} workers, its CPU a batch): stock "
            f"{t['stock_cpu_us_per_batch']} us, recorded {t['recorded_cpu_us_per_batch']} us "
            f"({t['added_us_per_batch']:+} us; A/A {t['aa_us_per_batch']:+} us)"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
