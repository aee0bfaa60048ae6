"""Profile a short study under real Nsight Systems and check our NVTX ranges in its report.

For each framework, runs ``examples/arxiv.py --quick`` under ``nsys profile -t nvtx``
(bounded by ``timeout``), imports the ``.qdstrm`` if nsys did not, reads the ``nvtxsum`` /
``nvtx_sum`` report as CSV, and checks that every expected range of ours is there with the
expected count (epochs x layers), the backward ranges (``<step> [backward]``) included.
With ``--ranks``, also profiles a two-process torch.distributed job (gloo) under one nsys, as
docs/distributed.md shows, and checks each rank's ranges apart (scripts/nsys_ranks.py).
Exits non-zero on any mismatch.

    python scripts/nsys_check.py [--python PYTHON] [--platform pyg dgl] [--epochs 2] [--ranks]
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPORTER = "/usr/lib/nsight-systems/host-linux-x64/QdstrmImporter"
DOMAIN = "instrumented_convs"
#: Every nsys run of this check: NVTX only (no CPU sampling or context switches), bounded.
NSYS_PROFILE = [
    "timeout",
    "600",
    "nsys",
    "profile",
    "-t",
    "nvtx",
    "--sample=none",
    "--cpuctxsw=none",
]

LAYERS = 3
PER_EPOCH = {"epoch": 1, "forward": 1, "loss": 1, "backward": 1, "optimizer.step": 1}
PER_LAYER = {
    "pyg": [
        "GCNConv",
        "gcn_norm",
        "add_remaining_self_loops",
        "degree",
        "normalize",
        "lin",
        "propagate",
        "collect",
        "message",
        "aggregate",
        "bias",
    ],
    "dgl": [
        "GraphConv",
        "zero_in_degree_check",
        "norm_src",
        "norm_dst",
        "matmul",
        "update_all",
        "bias",
    ],
}
# steps that occur twice per layer call (source and destination side)
TWICE = {"dgl": {"degrees", "pow", "mul"}}
# backward ranges ("<step> [backward]") per epoch of the 3-layer model (128 -> 128 -> 128 -> 40):
# a step has a backward only where its forward did differentiable work. DGL's first layer
# aggregates the input features (no grad) before its matmul, so its norm_src and update_all
# have none; gcn_norm's weights need no grad.
BACKWARD = {
    "pyg": {
        "GCNConv": 3,
        "lin": 3,
        "propagate": 3,
        "collect": 3,
        "message": 3,
        "aggregate": 3,
        "bias": 3,
    },
    "dgl": {
        "GraphConv": 3,
        "norm_src": 2,
        "norm_dst": 3,
        "mul": 5,
        "matmul": 3,
        "update_all": 2,
        "bias": 3,
    },
}


def expected(platform: str, epochs: int) -> Dict[str, int]:
    """Range name -> instances for ``epochs`` timed epochs (warm-up off)."""
    counts = {name: n * epochs for name, n in PER_EPOCH.items()}
    for name in PER_LAYER[platform]:
        counts[name] = LAYERS * epochs
    for name in TWICE.get(platform, ()):
        counts[name] = 2 * LAYERS * epochs
    for name, n in BACKWARD[platform].items():
        counts[name + " [backward]"] = n * epochs
    return counts


def nvtx_counts(report: str) -> Dict[str, int]:
    """Range name (without our domain prefix) -> instances, from an nsys report."""
    last = None
    for name in ("nvtxsum", "nvtx_sum"):  # 2022.x names it nvtxsum, 2023+ nvtx_sum
        proc = subprocess.run(
            [
                "timeout",
                "300",
                "nsys",
                "stats",
                "-q",
                "--force-export=true",
                "--report",
                name,
                "--format",
                "csv",
                report,
            ],
            capture_output=True,
            text=True,
        )
        last = proc
        text = proc.stdout
        start = text.find("Time (%)")
        if start < 0:
            start = text.find('"Time (%)"')
        if proc.returncode == 0 and start >= 0:
            rows = csv.DictReader(io.StringIO(text[start:]))
            out: Dict[str, int] = {}
            for row in rows:
                rng = row.get("Range") or row.get("Name") or ""
                if rng.startswith(DOMAIN + ":"):
                    out[rng[len(DOMAIN) + 1 :]] = int(row["Instances"])
            return out
    raise RuntimeError(f"nsys stats failed: {last.stderr if last else ''}")


def profile(python: str, platform: str, epochs: int, workdir: str) -> str:
    """Run the quick study under nsys; return the path of the .nsys-rep report."""
    args = [
        "--platform",
        platform,
        "--quick",
        "--epochs",
        str(epochs),
        "--warmup",
        "0",
        "--no-progress",
    ]
    script = os.path.join(ROOT, "examples", "arxiv.py")
    return run_profiled(os.path.join(workdir, f"study-{platform}"), [python, script, *args])


def run_profiled(out: str, argv: List[str], **env: str) -> str:
    """Run ``argv`` under ``nsys profile -o out`` (our tree on PYTHONPATH, ``env`` added);
    the path of its report."""
    env = dict(
        os.environ,
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        DGLBACKEND="pytorch",
        **env,
    )
    cmd = [*NSYS_PROFILE, "-o", out, "-f", "true", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(
            f"nsys profile failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return report(out, os.path.dirname(out), proc)


def report(out: str, workdir: Optional[str], proc: "subprocess.CompletedProcess[str]") -> str:
    """The ``.nsys-rep`` of output name ``out``, imported from its ``.qdstrm`` if needed."""
    rep = out + ".nsys-rep"
    if not os.path.exists(rep):
        qdstrm = glob.glob(out + ".qdstrm") or (
            glob.glob(os.path.join(workdir, "*.qdstrm")) if workdir else []
        )
        if not qdstrm:
            raise RuntimeError(
                f"nsys wrote neither {rep} nor a .qdstrm:\n{proc.stdout}\n{proc.stderr}"
            )
        subprocess.run(
            ["timeout", "300", IMPORTER, "-i", qdstrm[0]], capture_output=True, check=True
        )
    if not os.path.exists(rep):
        raise RuntimeError(f"no report at {rep}")
    return rep


def main(argv: List[str] = None) -> int:  # type: ignore[assignment]
    """Profile each platform and compare the counts; print a line per range."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--python", default=sys.executable, help="interpreter of the environment to profile"
    )
    p.add_argument("--platform", nargs="+", default=["pyg", "dgl"], choices=["pyg", "dgl"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--ranks", action="store_true", help="also check each rank of a 2-process job")
    args = p.parse_args(argv)
    if shutil.which("nsys") is None:
        print("nsys not found: run scripts/install_nsys.sh", file=sys.stderr)
        return 2
    failures = 0
    with tempfile.TemporaryDirectory(prefix="ic-nsys-") as workdir:
        for platform in args.platform:
            rep = profile(args.python, platform, args.epochs, workdir)
            got = nvtx_counts(rep)
            want = expected(platform, args.epochs)
            for name, n in sorted(want.items()):
                ok = got.get(name) == n
                failures += not ok
                print(
                    f"  {'ok ' if ok else 'BAD'} {platform:3s} {DOMAIN}:{name:28s} expected "
                    f"{n:3d}, nsys saw {got.get(name, 0)}"
                )
            extra = sorted(set(got) - set(want))
            if extra:
                print(f"  note: {platform} also recorded {extra}")
        if args.ranks:
            from nsys_ranks import check  # imports this module: not at the top

            failures += check(args.python, workdir)
    print("nsys check:", "passed" if not failures else f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
