"""Memory per step against the allocator's own figures (CUDA): the counters' ``left``/``peak``
and memory recording's ``peak_bytes`` (``configure(memory=True)``, on while the counters are).

With ``configure(counters=True)`` on CUDA, each step call reads
``torch.cuda.memory_allocated()`` before and after every op it runs
(:mod:`instrumented_convs.core.meters.counters`): its *left* is the reading after its last op less
the
one before its first, its *peak* the highest reading after any of its ops less that first one.
Here the same calls are measured from outside by the allocator itself: forward pre- and
post-hooks on each conv layer (and around the whole forward) call
``torch.cuda.reset_peak_memory_stats()`` and read ``memory_allocated()`` before,
``memory_allocated()`` and ``max_memory_allocated()`` after. Per layer instance, over
``--passes`` training forwards of the study's 3-layer PyG GCN (``--shape``):

- *left*: ours and the allocator's should agree but for what a call frees as it returns
  (its locals after its last op: ours keeps them, the allocator has freed them), so ours is
  at least the allocator's;
- *peak*: the allocator also sees what an op allocates and frees inside itself (workspace,
  temporaries of a fused kernel), which no reading between ops can: ours is at most the
  allocator's, and the gap is those buffers.

Memory recording's peak reads the same counter after the same ops (its level on CUDA is
``memory_allocated()``): it must equal the counters' peak, so at most the allocator's too,
and each layer call must be measured. Both are printed in MiB with their difference; the run
fails (exit 1) when a direction is violated by more than ``--slack`` bytes (default 0:
exact). On the CPU there is no allocator
to read: the steps' ``alloc_bytes`` (bytes of the tensors their ops allocated, summed) are
printed alone, so the script's plumbing runs anywhere (``--device cpu``).

    python benchmarks/memory.py --device cuda [--shape synthetic-arxiv] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import launch_bound as lb  # noqa: E402

import instrumented_convs as ic  # noqa: E402
from instrumented_convs.commands.study import SHAPES, build_model, synthetic_graph  # noqa: E402

MiB = 1024 * 1024


class Allocator:
    """Hooks reading the CUDA allocator around each call of the modules given: per name,
    a list of ``(left, peak)`` in bytes, one per call."""

    def __init__(self, modules: Dict[str, torch.nn.Module], device: torch.device) -> None:
        self.device, self.calls = device, {n: [] for n in modules}  # type: ignore[var-annotated]
        self._start: Dict[str, int] = {}
        self._handles = []
        for name, m in modules.items():
            self._handles.append(m.register_forward_pre_hook(self._pre(name)))
            self._handles.append(m.register_forward_hook(self._post(name)))

    def _pre(self, name: str) -> Any:
        def hook(module: Any, args: Any) -> None:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start[name] = torch.cuda.memory_allocated(self.device)

        return hook

    def _post(self, name: str) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            start = self._start.pop(name)
            after = torch.cuda.memory_allocated(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            self.calls[name].append((after - start, peak - start))

        return hook

    def remove(self) -> None:
        """Take the hooks off."""
        for h in self._handles:
            h.remove()


def measure(shape: str, device: torch.device, passes: int, hidden: int) -> Dict[str, Any]:
    """Training forwards (and backwards) of the study's PyG GCN with the counters on; ours
    and, on CUDA, the allocator's left and peak per layer instance."""
    data = synthetic_graph(shape, **SHAPES[shape]).to(device)
    torch.manual_seed(0)
    model, graph = build_model("pyg", data, hidden=hidden)
    model = model.to(device)
    ic.name_layers(model)
    layers = {n: m for n, m in model.named_modules() if type(m).__name__ == "GCNConv"}
    cuda = device.type == "cuda"
    for _ in range(2):  # warm-up: cuBLAS handles and workspaces, the caching allocator
        F.nll_loss(model(data.x, graph), data.y).backward()
    if cuda:
        torch.cuda.synchronize(device)
    oracle = Allocator(layers, device) if cuda else None
    ic.registry.reset()
    try:
        with ic.configure(counters=True, memory=True):
            for _ in range(passes):
                model.zero_grad()
                out = model(data.x, graph)
                F.nll_loss(out, data.y).backward()
                del out
            summary = ic.registry.summary(by="layer")
    finally:
        if oracle is not None:
            oracle.remove()
    rows: List[Dict[str, Any]] = []
    for r in summary.rows:
        if r.phase != "forward":
            continue
        rows.append(
            {
                "path": r.name,
                "layer": r.scope,
                "calls": r.count,
                "cuda_calls": r.cuda_calls,
                "left": r.cuda_left,
                "peak": r.cuda_peak,
                "alloc_bytes": r.alloc_bytes,
                "mem_calls": r.mem_calls,
                "mem_peak": r.peak_bytes,
                "saved": r.saved_bytes,
            }
        )
    layers_out = []
    for name in layers:
        mine = [x for x in rows if x["layer"] == name and "/" not in x["path"]]
        entry: Dict[str, Any] = {"layer": name, "ours": mine[0] if mine else None}
        if oracle is not None:
            calls = oracle.calls[name]
            entry["allocator"] = {
                "calls": len(calls),
                "left": sum(c[0] for c in calls),
                "peak": max((c[1] for c in calls), default=0),
            }
        layers_out.append(entry)
    return {
        "shape": shape,
        "device": str(device),
        "passes": passes,
        "layers": layers_out,
        "rows": rows,
    }


def judge(result: Dict[str, Any], slack: int) -> List[str]:
    """The violated directions (ours' left below the allocator's, ours' peak above it)."""
    bad = []
    for e in result["layers"]:
        ours, alloc = e["ours"], e.get("allocator")
        if alloc is None:
            continue
        if ours is None or ours["cuda_calls"] != alloc["calls"]:
            bad.append(
                f"{e['layer']}: calls read {ours and ours['cuda_calls']}, "
                f"allocator {alloc['calls']}"
            )
            continue
        if ours["left"] + slack < alloc["left"]:
            bad.append(f"{e['layer']}: left {ours['left']} < allocator's {alloc['left']}")
        if ours["peak"] > alloc["peak"] + slack:
            bad.append(f"{e['layer']}: peak {ours['peak']} > allocator's {alloc['peak']}")
        if ours["mem_calls"] != alloc["calls"] or ours["mem_peak"] != ours["peak"]:
            bad.append(
                f"{e['layer']}: memory's peak {ours['mem_peak']} over {ours['mem_calls']} calls, "
                f"the counters' {ours['peak']} over {alloc['calls']}"
            )
    return bad


def main(argv: Optional[List[str]] = None) -> int:
    """Print the comparison; exit 1 when a direction is violated."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--shape", default="synthetic-cora", choices=sorted(SHAPES))
    p.add_argument("--passes", type=int, default=5, help="training steps measured")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--slack", type=int, default=0, help="bytes a direction may be off")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    device = lb.device_of(args.device)
    if device is None:
        return 2
    result = measure(args.shape, device, args.passes, args.hidden)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"Memory per step, {args.shape}, {args.passes} training steps, {device} ({where})")
    if device.type == "cuda":
        print(
            f"  {'layer':10s} {'calls':>5s} {'left MiB':>9s} {'alloc.':>9s} "
            f"{'peak MiB':>9s} {'alloc.':>9s} {'peak gap MiB':>12s}"
        )
        for e in result["layers"]:
            o, a = e["ours"] or {}, e["allocator"]
            gap = (a["peak"] - o.get("peak", 0)) / MiB
            print(
                f"  {e['layer']:10s} {a['calls']:5d} {o.get('left', 0) / MiB:9.2f} "
                f"{a['left'] / MiB:9.2f} {o.get('peak', 0) / MiB:9.2f} "
                f"{a['peak'] / MiB:9.2f} {gap:12.3f}"
            )
    print(
        f"  {'step (forward)':42s} {'layer':8s} {'calls':>5s} {'left MiB':>9s} "
        f"{'peak MiB':>9s} {'allocated MiB':>13s} {'kept MiB':>9s} {'mem. peak':>9s}"
    )
    for r in result["rows"]:
        print(
            f"  {r['path'][:42]:42s} {str(r['layer'])[:8]:8s} {r['calls']:5d} "
            f"{r['left'] / MiB:9.2f} {r['peak'] / MiB:9.2f} "
            f"{r['alloc_bytes'] / MiB:13.2f} {r['saved'] / max(r['calls'], 1) / MiB:9.2f} "
            f"{r['mem_peak'] / MiB:9.2f}"
        )
    bad = judge(result, args.slack)
    result["violations"] = bad
    for line in bad:
        print("VIOLATED: " + line)
    if device.type == "cuda" and not bad:
        print(
            "ours' left >= the allocator's and ours' peak <= the allocator's for every layer; "
            "memory's peak = the counters'"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
