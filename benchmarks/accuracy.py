"""Are the numbers right? Our CUDA-event step times against the profiler's kernel times (GPU).

On a CUDA device, runs forward passes of the study's 3-layer PyG GCN at ogbn-arxiv's shape
(generated graph) under ``torch.profiler`` (CPU + CUDA activities, i.e. CUPTI). For every
step it compares

- our inclusive time (CUDA events around the step, ``registry.summary()``), with
- the sum of the CUDA kernel times the profiler attributes to the ``record_function`` label
  of the same name (``device_time_total`` of the label's events),

and for each layer the sum of its top-level steps with the layer's own time (how much of the
layer the steps cover). It also counts the synchronising CUDA runtime calls
(``cudaDeviceSynchronize``, ``cudaStreamSynchronize``, ``cudaEventSynchronize``) during the
instrumented passes and during the same passes with instrumentation disabled: the difference
is what our hot path adds (it should be 0).

    python benchmarks/accuracy.py [--passes 20] [--sparse] [--shape synthetic-arxiv] [--json FILE]

Exits with status 2 and a message when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List

import torch

import instrumented_convs as ic
from instrumented_convs.commands.study import SHAPES, build_model, load_graph

SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")


def _device_time_us(evt: Any) -> float:
    for attr in ("device_time_total", "cuda_time_total"):
        if hasattr(evt, attr):
            return float(getattr(evt, attr))
    return 0.0


def _profile(fn: Any, passes: int) -> Any:
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(passes):
            fn()
        torch.cuda.synchronize()
    return prof


def _sync_count(prof: Any) -> int:
    return sum(1 for e in prof.events() if e.name in SYNC_CALLS)


def main(argv: List[str] = None) -> int:  # type: ignore[assignment]
    """Measure and print the comparison."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", default="synthetic-arxiv", choices=sorted(SHAPES))
    p.add_argument("--passes", type=int, default=20, help="forward passes profiled")
    p.add_argument("--sparse", action="store_true", help="SparseTensor input (fused path)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/accuracy.py needs a CUDA device; none found.", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    data = load_graph(args.shape).to(dev)
    torch.manual_seed(0)
    model, graph = build_model("pyg", data, sparse=args.sparse)
    graph = graph.to(dev)
    model = model.to(dev).eval()

    def forward() -> None:
        with torch.no_grad():
            model(data.x, graph)

    for _ in range(3):
        forward()
    torch.cuda.synchronize()

    ic.registry.reset()
    prof = _profile(forward, args.passes)
    summary = ic.registry.summary()
    syncs_on = _sync_count(prof)
    with ic.configure(enabled=False):
        syncs_off = _sync_count(_profile(forward, args.passes))

    labels: Dict[str, float] = {}
    for evt in prof.events():
        if evt.name in {r.step for r in summary}:
            labels[evt.name] = labels.get(evt.name, 0.0) + _device_time_us(evt) * 1e-6
    rows = []
    print(
        f"Per-step time: CUDA events (ours) vs CUPTI kernel sum per label; "
        f"{args.passes} forward passes, "
        f"{args.shape}{' SparseTensor' if args.sparse else ''}, {torch.cuda.get_device_name()}"
    )
    print(f"  {'step':50s} {'ours ms':>10s} {'kernels ms':>11s} {'ours/kernels':>13s}")
    by_step: Dict[str, float] = {}
    for r in summary:
        by_step[r.step] = by_step.get(r.step, 0.0) + r.total
    for step, ours in by_step.items():
        kern = labels.get(step, 0.0)
        ratio = ours / kern if kern else float("nan")
        rows.append({"step": step, "ours_s": ours, "kernels_s": kern, "ratio": ratio})
        print(f"  {step:50s} {ours * 1e3:10.3f} {kern * 1e3:11.3f} {ratio:13.3f}")
    layer = summary["GCNConv"]
    covered = sum(r.total for r in summary.children("GCNConv"))
    print(f"layer coverage: top-level steps sum to {covered / layer.total:.1%} of GCNConv's time")
    print(
        f"synchronising CUDA calls in {args.passes} passes: instrumented {syncs_on}, "
        f"disabled {syncs_off} (added by instrumentation: {syncs_on - syncs_off})"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "rows": rows,
                    "coverage": covered / layer.total,
                    "syncs": {"on": syncs_on, "off": syncs_off},
                },
                fh,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
