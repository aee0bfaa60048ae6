"""The checks of ``scripts/gpu.sh`` that are not commands of their own: the machine's facts,
a ``run`` folder's page, timeline and host/device verdict, and the summary of every result.

    python scripts/gpu_checks.py facts FILE.json            # device, driver, clocks, versions
    python scripts/gpu_checks.py run-folder DIR --device cuda  # page, trace, the GPU track
    python scripts/gpu_checks.py verdict DIR --expect launch-bound [--device cuda] [--json F]
    python scripts/gpu_checks.py advice DIR [--expect RULE ...]  # what an advised run said
    python scripts/gpu_checks.py summary DIR                # the figures of DIR's results
    python scripts/gpu_checks.py first-sync warn|error      # what the first CUDA steps sync

``run-folder`` exits 1 when the folder lacks its table, page or timeline, or (``--device
cuda``) when the timeline has no GPU track (spans of category ``...,gpu``, timed by the
steps' own CUDA events) or a GPU span is not inside the run; on the CPU it must have none.
``verdict`` prints the run's host/device section and exits 1 unless the training regions'
verdicts (:func:`training_regions`) match ``--expect`` for most of their device time; on the
CPU the run must have no such section. ``advice`` prints an advised run's items and the
changes timed on its layers, and exits 1 unless every ``--expect`` rule was advised.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

#: Issue 52's goals: check's cost section on a GPU (defaults / stock per shape) and the
#: launch-bound proxy on CUDA (defaults / stock; and at most half torch.profiler's added time).
COST_GOALS = {"cora": 1.08, "arxiv": 1.02}
LB_GOAL = 1.15

#: nvidia-smi's fields recorded with the figures (the clocks now and at most, the power cap).
SMI_FIELDS = (
    "name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,"
    "clocks.applications.graphics,power.draw,power.limit,temperature.gpu,memory.total"
)


def facts(path: str) -> int:
    """Write the machine's facts (nvidia-smi's, torch's, the packages') to ``path``."""
    import torch

    out: Dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("torch_geometric", "dgl", "nvtx", "torch_sparse", "torch_scatter"):
        try:
            mod = __import__(name)
            out[name] = getattr(mod, "__version__", "?")
        except Exception as exc:  # not there (DGL, torch-sparse on the GPU machine)
            out[name] = f"not importable: {type(exc).__name__}"
    from instrumented_convs.core import native

    out["fast_path"] = native.IMPLEMENTATION
    out["cuda"] = torch.cuda.is_available()
    if out["cuda"]:
        p = torch.cuda.get_device_properties(0)
        out.update(
            device=p.name,
            sm_count=p.multi_processor_count,
            memory_gib=round(p.total_memory / 2**30, 1),
            cuda_runtime=torch.version.cuda,
        )
        from instrumented_convs.core.clocks import events

        torch.zeros(1, device="cuda")  # CUDA up: the clock of CUDA steps is decided
        out["cuda_clock"] = "C" if events.native() else "Python twin"
        try:
            smi = subprocess.run(
                ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout.strip()
            out["nvidia_smi"] = dict(zip(SMI_FIELDS.split(","), smi.split(", ")))
        except (OSError, subprocess.SubprocessError) as exc:
            out["nvidia_smi"] = f"unavailable: {exc}"
    Path(path).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


def first_sync(mode: str) -> int:
    """In a fresh process, the first CUDA steps of ``check``'s events test (a step around a
    matmul, five times) under ``torch.cuda.set_sync_debug_mode(mode)``: with ``warn``, every
    warning caught (its text and where it came from) and every ``torch.cuda.synchronize``
    with its stack; with ``error``, the stack of the first synchronising call, if any."""
    import traceback
    import warnings

    import torch

    from instrumented_convs import registry
    from instrumented_convs.layers import step

    dev = torch.device("cuda", 0)
    x = torch.randn(2048, 2048, device=dev)
    x @ x
    torch.cuda.synchronize(dev)
    registry.reset()
    real = torch.cuda.synchronize
    stacks: List[str] = []

    def counted(*a: Any, **k: Any) -> Any:
        stacks.append("".join(traceback.format_stack(limit=12)))
        return real(*a, **k)

    torch.cuda.synchronize = counted  # type: ignore[assignment]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(mode)
        try:
            for _ in range(5):
                with step("check: matmul", device=dev):
                    x @ x
        except RuntimeError:
            print(f"first-sync ({mode}): a synchronising call raised:")
            traceback.print_exc()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize = real  # type: ignore[assignment]
    for w in caught:
        print(
            f"first-sync ({mode}): warning {w.category.__name__} at {w.filename}:{w.lineno}: "
            f"{str(w.message)[:300]}"
        )
    for st in stacks:
        print(f"first-sync ({mode}): torch.cuda.synchronize called from:\n{st}")
    print(f"first-sync ({mode}): {len(caught)} warnings, {len(stacks)} synchronize calls")
    return 0


def _spans(trace: Any) -> List[Dict[str, Any]]:
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X"]


def run_folder(folder: str, device: str) -> int:
    """Check a ``run`` folder: its table, page and timeline, and the GPU track on CUDA."""
    d = Path(folder)
    problems = [
        f"{n} missing or empty"
        for n in ("run.json", "page.html", "trace.json.gz")
        if not (d / n).is_file() or (d / n).stat().st_size == 0
    ]
    if problems:
        print(f"{folder}: " + "; ".join(problems))
        return 1
    with gzip.open(d / "trace.json.gz", "rt") as fh:
        spans = _spans(json.load(fh))
    gpu = [e for e in spans if str(e.get("cat", "")).endswith(",gpu")]
    cpu = [e for e in spans if not str(e.get("cat", "")).endswith(",gpu")]
    names = sorted({e["name"] for e in gpu})
    print(f"{folder}: {len(cpu)} CPU spans, {len(gpu)} GPU spans ({', '.join(names[:12])})")
    if device.startswith("cuda"):
        if not gpu:
            print("FAILED: no GPU track in the timeline of a CUDA run")
            return 1
        lo = min(e["ts"] for e in cpu)
        hi = max(e["ts"] + e["dur"] for e in cpu)
        # the GPU finishes a step after its launches: allow the run's last second beyond
        out = [e for e in gpu if e["ts"] < lo - 1e3 or e["ts"] + e["dur"] > hi + 1e6]
        if out:
            print(f"FAILED: {len(out)} GPU spans outside the run, e.g. {out[0]}")
            return 1
        if not {"GCNConv", "propagate"} <= set(names):
            print("FAILED: the GPU track lacks the layer's steps")
            return 1
    elif gpu:
        print("FAILED: GPU spans in a CPU run")
        return 1
    return 0


def loaders(folder: str, device: str) -> int:
    """Check a ``run`` folder of ``tests/scripts/loader_training.py``: every batch its
    workers made taken, the batches' copies a region (on CUDA timed by events: a GPU span
    each), a worker process each on the timeline and an arrow per batch taken."""
    d = Path(folder)
    run = json.loads((d / "run.json").read_text())
    section = run.get("workers") or {}
    (loader,) = section.get("loaders") or [None]
    if loader is None:
        print(f"{folder}: FAILED: no loader recorded")
        return 1
    made = sum(w["batches"] for w in section["workers"])
    with gzip.open(d / "trace.json.gz", "rt") as fh:
        events = json.load(fh)["traceEvents"]
    copies = [e for e in events if e.get("ph") == "X" and e["name"] == "copy"]
    gpu = [e for e in copies if str(e.get("cat", "")).endswith(",gpu")]
    arrows = [e for e in events if e.get("name") == "batch -> loop" and e.get("ph") == "s"]
    procs = [e for e in events if e.get("name") == "process_name"]
    print(
        f"{folder}: {loader['consumed']} batches taken, {made} made by "
        f"{len(section['workers'])} workers; {len(copies) - len(gpu)} copies, {len(gpu)} on the "
        f"GPU track; {len(arrows)} arrows; {len(procs)} processes"
    )
    problems = []
    if made != loader["consumed"]:
        problems.append("made != taken")
    if len(arrows) != loader["consumed"] or len(procs) != 1 + len(section["workers"]):
        problems.append("the timeline lacks workers or arrows")
    if device.startswith("cuda") and len(gpu) != len(copies) - len(gpu):
        problems.append("a copy without its GPU span")
    for p in problems:
        print(f"FAILED: {p}")
    return 1 if problems else 0


def training_regions(summary: Any) -> List[Any]:
    """The regions a verdict is judged by: the top-level regions timed on the device, or,
    where there is one only and it holds regions (the study's ``epoch`` around ``forward``,
    ``loss``, ``backward``, ``optimizer.step``), the regions right inside it; each a
    :class:`~instrumented_convs.report.hostdevice.Part`."""
    from instrumented_convs.report.hostdevice import Part
    from instrumented_convs.report.row import host_estimate

    rows = [r for r in summary.rows if r.device_calls and r.kind == "region"]
    tops = [r for r in rows if r.depth == 0]
    if len(tops) == 1:
        inner = [r for r in rows if r.depth == 1 and r.name.startswith(tops[0].name + "/")]
        tops = inner or tops
    return [
        Part(r.name, "region", host_estimate(r), r.total, r.device_calls, r.lag, r.caught, r.count)
        for r in tops
    ]


def verdict(folder: str, expect: str, device: str, out: Optional[str] = None) -> int:
    """Print a run folder's host/device section; 0 when the training regions' verdicts are
    ``expect`` for most of their device time (on the CPU: when the run has no section)."""
    from instrumented_convs.report import Summary
    from instrumented_convs.report.hostdevice import lines

    run = json.loads((Path(folder) / "run.json").read_text())
    section = (run.get("summary") or {}).get("host_device")
    result: Dict[str, Any] = {"folder": folder, "expect": expect, "device": device}
    if not device.startswith("cuda"):
        ok = section is None
        said = "no host/device section, as on the CPU" if ok else "FAILED: one in a CPU run"
        print(f"{folder}: {said}")
        result.update(passed=ok, regions=[])
    elif section is None:
        print(f"{folder}: FAILED: no host/device section in a CUDA run")
        result.update(passed=False, regions=[])
    else:
        summary = Summary.load(folder)
        print("\n".join(lines(summary)))
        parts = training_regions(summary)
        total = sum(p.device for p in parts)
        agree = sum(p.device for p in parts if p.verdict == expect)
        share = agree / total if total > 0 else 0.0
        for p in parts:
            print(
                f"  {p.name}: {p.verdict}, device {p.device * 1e3:.3f} ms, host "
                f"{p.host * 1e3:.3f} ms ({100 * p.share:.0f}%), {p.caught} of {p.calls} calls "
                f"caught up, mean lag {p.mean_lag * 1e6:.1f} us"
            )
        ok = share > 0.5
        print(
            f"{folder}: {'PASS' if ok else 'FAILED'}: {100 * share:.0f}% of the training "
            f"regions' device time is {expect} (expected: most of it)"
        )
        result.update(
            passed=ok,
            share=share,
            regions=[p.as_dict() for p in parts],
            section=section,
        )
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    return 0 if result["passed"] else 1


def _load(path: Path) -> Optional[Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _goal(what: str, value: float, limit: float, unit: str) -> str:
    """A goal's line: PASS when ``value`` is at most ``limit``."""
    verdict = "PASS" if value <= limit else "FAIL"
    f = ".3f" if unit.startswith("x") else ".0f"
    return f"goal | {verdict} | {what}: {value:{f}} {unit}, at most {limit:{f}}"


def _summary_issue52(d: Path) -> None:
    """The figures of issue 52: a step against its raw records, where the cost goes, the
    verdicts at both shapes."""
    cs = _load(d / "cuda_step.json")
    if cs:
        parts = ", ".join(f"{k} {v:.0f}" for k, v in cs.get("parts_ns", {}).items())
        print(
            f"cuda_step | ns a call ({'C clock' if cs.get('c_clock') else 'Python twin'}): {parts}"
        )
        for name, f in cs.get("steps", {}).items():
            print(
                f"cuda_step | {name}: {f['step_ns']:.0f} ns, 2 raw records {f['records_ns']:.0f} "
                f"ns, difference {f['difference_ns']:.0f} ns"
            )
        for name, f in cs.get("reads_ns", {}).items():
            figures = ", ".join(f"{k} {v:.0f}" for k, v in f.items())
            print(f"cuda_step | reading a pair the device has run, {name}: {figures}")
        for name, f in cs.get("in_situ", {}).items():
            figures = ", ".join(f"{k} {v:.3g}" for k, v in f.items())
            print(f"cuda_step | in situ, {name}: {figures}")
        if str(cs.get("device", "")).startswith("cuda"):
            for g in cs.get("goals", []):
                if g["pass"] is None:
                    print(f"goal | NOT MEASURED | {g['step']}: {g['goal']}: the C clock not in use")
                elif "value_ns" not in g:  # a share: at least its limit
                    verdict = "PASS" if g["pass"] else "FAIL"
                    print(f"goal | {verdict} | {g['step']}: {g['goal']}: {g['value']:.1%}")
                else:
                    print(_goal(f"{g['step']}: {g['goal']}", g["value_ns"], g["limit_ns"], "ns"))
    dc = _load(d / "device_cost.json")
    if dc:
        for shape, r in dc.get("shapes", {}).items():
            med = r["median_ms"]["stock"]
            print(
                f"device_cost | {shape}: stock "
                + ", ".join(f"{c} {v:.3f} ms" for c, v in med.items())
                + " | "
                + "; ".join(
                    f"{v} " + "/".join(f"{x:.3f}" for x in q.values())
                    for v, q in r["ratio"].items()
                )
                + f" ({'/'.join(med)} ratios to stock)"
            )
            print(f"device_cost | {shape}: {r['conclusion']['text']}")
    for f in sorted(d.glob("verdict-*.json")):
        v = _load(f) or {}
        regions = ", ".join(
            f"{p['name'].rsplit('/', 1)[-1]} {p['verdict']} ({p['device'] * 1e3:.2f} ms, host "
            f"{100 * p['share']:.0f}%)"
            for p in v.get("regions", [])
        )
        share = f"{100 * v['share']:.0f}% of the device time" if "share" in v else "no section"
        print(
            f"verdict | {f.stem[8:]}: expected {v.get('expect')}: "
            f"{'PASS' if v.get('passed') else 'FAIL'} ({share}) | {regions}"
        )


def summary(folder: str) -> int:
    """Print the figures of the run's results (what docs/performance.md records)."""
    d = Path(folder)
    f = _load(d / "facts.json") or {}
    print(
        f"device: {f.get('device', 'CPU')}; torch {f.get('torch')}, PyG "
        f"{f.get('torch_geometric')}, Python {f.get('python')}, fast path "
        f"{f.get('fast_path')}, CUDA steps timed by {f.get('cuda_clock', 'no CUDA clock')}"
    )
    if isinstance(f.get("nvidia_smi"), dict):
        print("nvidia-smi: " + ", ".join(f"{k} {v}" for k, v in f["nvidia_smi"].items()))
    check = _load(d / "check.json")
    for part in (check, _load(d / "check-other.json")):
        for s in (part or {}).get("sections", []):
            for line in s.get("lines", []):
                print(
                    f"check | {s.get('title', '')[:28]:28s} | {line.get('status'):7s} | "
                    f"{line.get('name')}: {str(line.get('detail'))[:150]}"
                )
    if check and str(check.get("device", "")).startswith("cuda"):
        for s in check.get("sections", []):
            for line in s.get("lines", []) if s.get("title", "").endswith("Cost") else []:
                shape = line.get("name", "").rsplit(", ", 1)[-1]
                on = ((line.get("data") or {}).get("ratios") or {}).get("enabled")
                if on is not None and shape in COST_GOALS:
                    print(_goal(f"check cost {line['name']}", on, COST_GOALS[shape], "x stock"))
    lb = _load(d / "launch_bound.json")
    if lb:
        for label, r in lb.get("results", {}).items():
            q = r["ratio"]
            print(
                f"launch-bound | {label:12s} stock {r['median_us']['stock']:.0f} us/epoch | "
                + ", ".join(f"{k} {v:.3f}" for k, v in q.items())
                + f" | rows {r['rows']['defaults']}, {r['us_per_row']['defaults']:.2f} us/row"
                + (f" | budget chose 1 in {r['budget_every']}" if "budget_every" in r else "")
            )
            if str(lb.get("info", {}).get("device", "")).startswith("cuda"):
                print(_goal(f"launch-bound {label} defaults", q["defaults"], LB_GOAL, "x stock"))
                extra = r.get("extra_us", {})
                if "torch.profiler" in extra:
                    print(
                        _goal(
                            f"launch-bound {label} defaults' added us vs half torch.profiler's",
                            extra["defaults"],
                            extra["torch.profiler"] / 2,
                            "us",
                        )
                    )
    _summary_issue52(d)
    fid = _load(d / "fidelity.json")
    if fid:
        info = fid["info"]
        print(
            f"fidelity | {info['iterations']} iterations, 1 in {info['every']}: largest "
            f"difference {info['worst_share_points']:.2f} points of a share, "
            f"{info['worst_mean_percent']:.2f}% of a layer's mean"
        )
    mem = _load(d / "memory.json")
    if mem:
        for e in mem.get("layers", []):
            o, a = e.get("ours") or {}, e.get("allocator")
            if a:
                print(
                    f"memory | {e['layer']}: left ours {o.get('left')} B, allocator "
                    f"{a['left']} B; peak ours {o.get('peak')} B, allocator {a['peak']} B"
                )
        print(f"memory | violations: {mem.get('violations')}")
    acc = _load(d / "accuracy.json")
    if acc:
        for r in acc.get("rows", []):
            print(
                f"accuracy (forward, arxiv) | {r['step']}: ours {r['ours_s'] * 1e3:.3f} ms, "
                f"kernels {r['kernels_s'] * 1e3:.3f} ms"
            )
        print(f"accuracy | syncs {acc.get('syncs')}, coverage {acc.get('coverage'):.3f}")
    steps = d / "steps.txt"
    if steps.is_file():
        print(steps.read_text().rstrip())
    return 0


def advice(folder: str, expect: List[str]) -> int:
    """An advised run's items (rule, layers, at stake, saved as timed) and each layer's timed
    changes; 1 unless every rule of ``expect`` was advised."""
    d = Path(folder)
    items = json.loads((d / "advice.json").read_text())["advice"]
    for i in items:
        saved = i.get("measured_saving_share")
        print(
            f"advice | {i['rule']} | {', '.join(x['path'] for x in i['layers'])} | "
            f"{i['at_stake_share']:.1%} at stake"
            + (f", {saved:.1%} saved as timed" if saved is not None else "")
            + f" | {i['why']}"
        )
    run = json.loads((d / "run.json").read_text())
    for layer in (run.get("signals") or {}).get("layers", []):
        for rule, t in (layer.get("trials") or {}).items():
            print(
                f"timed | {layer['path']} ({layer['class']}) | {rule} | stock "
                f"{t['stock_s'] * 1e3:.3f} ms, changed {t['changed_s'] * 1e3:.3f} ms, A/A "
                f"{t['aa_s'] * 1e3:.3f} ms, made in {t['convert_s'] * 1e3:.1f} ms, difference "
                f"{t['difference']}, {'the same model' if t['equal'] else 'another model'}"
            )
    missing = sorted(set(expect) - {i["rule"] for i in items})
    for rule in missing:
        print(f"FAILED: {rule} was not advised")
    return 1 if missing else 0


def main(argv: Optional[List[str]] = None) -> int:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("facts").add_argument("file")
    r = sub.add_parser("run-folder")
    r.add_argument("folder")
    r.add_argument("--device", default="cpu")
    w = sub.add_parser("loaders")
    w.add_argument("folder")
    w.add_argument("--device", default="cpu")
    v = sub.add_parser("verdict")
    v.add_argument("folder")
    v.add_argument("--expect", required=True, choices=("launch-bound", "device-bound"))
    v.add_argument("--device", default="cuda")
    v.add_argument("--json", metavar="FILE", help="write the verdict here")
    ad = sub.add_parser("advice")
    ad.add_argument("folder")
    ad.add_argument("--expect", nargs="*", default=[], metavar="RULE")
    sub.add_parser("summary").add_argument("folder")
    sub.add_parser("first-sync").add_argument("mode", choices=("warn", "error"))
    a = p.parse_args(argv)
    if a.cmd == "facts":
        return facts(a.file)
    if a.cmd == "first-sync":
        return first_sync(a.mode)
    if a.cmd == "run-folder":
        return run_folder(a.folder, a.device)
    if a.cmd == "verdict":
        return verdict(a.folder, a.expect, a.device, a.json)
    if a.cmd == "advice":
        return advice(a.folder, a.expect)
    if a.cmd == "loaders":
        return loaders(a.folder, a.device)
    return summary(a.folder)


if __name__ == "__main__":
    sys.exit(main())
