"""Profile a short study under real Nsight Systems and check our NVTX ranges in its report.

For each framework, runs ``python -m instrumented_convs run -o RUN examples/arxiv.py --quick``
under ``nsys profile -t nvtx`` (bounded by ``timeout``), imports the ``.qdstrm`` if nsys did
not, and checks the report two ways:

- its ``nvtxsum`` / ``nvtx_sum`` report (CSV): every expected range of ours is there with the
  expected count (epochs x layers), the backward ranges (``<step> [backward]``) included, and
  ``run``'s own phases (``forward``, ``backward``, ``optimizer.step`` around the script's);
- our table read back from it (``view REPORT.nsys-rep --format json``, which exports
  ``REPORT.sqlite`` beside it through nsys, and ``view REPORT.sqlite``) against the table the
  same process saved (``view RUN --format json``): the same rows (step path, phase, kind) in
  the same order with the same counts (a registry reset leaves a mark: the ranges before it
  are dropped, as the process dropped their times); each report total at least the run's
  less 1 us a call (a range also holds our own time around the clock's reading); the
  outermost rows (``epoch``) within 1%. The largest relative difference at each depth is
  printed, to see how close.

With ``--ranks``, also profiles a two-process torch.distributed job (gloo) under one nsys, as
docs/distributed.md shows, checks each rank's ranges apart, and reads the report back as a
merged table and each ``--rank`` apart, against what each rank saved (scripts/nsys_ranks.py).
Prints a line per check (ok / BAD); exits non-zero on any mismatch.

    python scripts/nsys_check.py [--python PYTHON] [--platform pyg dgl] [--epochs 2] [--ranks]
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPORTER = "/usr/lib/nsight-systems/host-linux-x64/QdstrmImporter"
DOMAIN = "instrumented_convs"
#: Every nsys run of this check: NVTX only (no CPU sampling or context switches), bounded, one
#: session at a time on this machine (scripts/nsys_locked.sh: the tests profile too).
NSYS_PROFILE = [
    "bash",
    os.path.join(ROOT, "scripts", "nsys_locked.sh"),
    "600",
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
# the regions ``run`` opens itself around the loop's phases: here each around the script's own
# step of the same name, so twice a range of that name per epoch
HOOKED = ("forward", "backward", "optimizer.step")
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


def expected(platform: str, epochs: int, hooked: bool = True) -> Dict[str, int]:
    """Range name -> instances for ``epochs`` timed epochs (warm-up off), the script run by
    ``python -m instrumented_convs run`` (``hooked``) or bare."""
    counts = {name: n * epochs for name, n in PER_EPOCH.items()}
    for name in HOOKED if hooked else ():
        counts[name] += epochs
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


def profile(python: str, platform: str, epochs: int, workdir: str) -> Tuple[str, str]:
    """Run the quick study under ``run`` under nsys; the .nsys-rep report and the run folder."""
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
    folder = os.path.join(workdir, f"run-{platform}")
    argv = [python, "-m", "instrumented_convs", "run", "-o", folder, script, *args]
    return run_profiled(os.path.join(workdir, f"study-{platform}"), argv), folder


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
    if proc.returncode != 0 and "Traceback" not in proc.stderr:  # nsys's own hiccup: once more
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


#: Seconds one ``view`` may take (a .nsys-rep's includes its export).
VIEW_LIMIT = 300
#: What the report's ranges may lose against the in-process clock, per call (seconds).
PER_CALL_SLACK = 1e-6
#: How far the outermost rows' totals may differ, relatively.
OUTER_LIMIT = 0.01

Key = Tuple[str, str]  # a row's step path and phase


def view_json(python: str, target: str, *flags: str) -> Dict[str, Any]:
    """``python -m instrumented_convs view TARGET --format json FLAGS`` run by ``python`` (our
    tree on PYTHONPATH, bounded): the table as JSON; a RuntimeError with its error otherwise."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = ["view", target, "--format", "json", *flags]
    cmd = ["timeout", str(VIEW_LIMIT), python, "-m", DOMAIN, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {last}")
    try:
        return json.loads(proc.stdout)
    except ValueError as e:
        raise RuntimeError(f"{' '.join(args)}: not JSON ({e})") from None


def rows_of(table: Dict[str, Any]) -> Dict[Key, Dict[str, Any]]:
    """A table's rows by step path and phase (scope-less: the tables are by step)."""
    return {(r["name"], r["phase"]): r for r in table["rows"]}


def label(key: Key) -> str:
    """A row as the table shows it: its path, `` [backward]`` after a backward step's."""
    return key[0] + (" [backward]" if key[1] == "backward" else "")


def _show(keys: List[Key], most: int = 4) -> str:
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return ", ".join(label(k) for k in keys[:most]) + more


def compare_rows(
    who: str, got: Dict[str, Any], want: Dict[str, Any], fields: Tuple[str, ...] = ("kind",)
) -> int:
    """Print whether table ``got`` has ``want``'s rows in its order with the same counts (and
    ``fields``); the number of mismatches."""
    mine, theirs = rows_of(got), rows_of(want)
    failures = 0
    missing = [k for k in theirs if k not in mine]
    extra = [k for k in mine if k not in theirs]
    common = [k for k in theirs if k in mine]
    order = [k for k in mine if k in theirs] == common
    differ = [k for k in common if any(mine[k][f] != theirs[k][f] for f in fields)]
    ok = not missing and not extra and order and not differ
    failures += not ok
    what = "path, phase, " + ", ".join(fields)
    head = (
        f"the same {len(theirs)} rows ({what}), in the same order"
        if ok
        else f"{len(theirs)} rows ({what}) expected, {len(mine)} read"
    )
    print(
        f"  {'ok ' if ok else 'BAD'} {who}: {head}"
        + (f"; missing {_show(missing)}" if missing else "")
        + (f"; extra {_show(extra)}" if extra else "")
        + ("" if order else "; in another order")
        + (
            "; differing "
            + ", ".join(
                f"{label(k)} {f} {mine[k][f]} not {theirs[k][f]}"
                for k in differ[:4]
                for f in fields
                if mine[k][f] != theirs[k][f]
            )
            if differ
            else ""
        )
    )
    counts = [k for k in common if mine[k]["count"] != theirs[k]["count"]]
    failures += bool(counts)
    calls = sum(theirs[k]["count"] for k in common)
    if counts:
        differ_counts = ", ".join(
            f"{label(k)} {mine[k]['count']} not {theirs[k]['count']}" for k in counts
        )
        print(f"  BAD {who}: other counts: {differ_counts}")
    else:
        print(f"  ok  {who}: the same counts, {calls} calls in all")
    return failures


def compare_totals(
    who: str,
    got: Dict[str, Any],
    want: Dict[str, Any],
    timed: Callable[[Key], bool] = lambda key: True,
    outer: bool = True,
    depths: bool = True,
) -> int:
    """Print whether each of ``got``'s totals (a report's) is at least ``want``'s (a run's) less
    1 us a call, and (``outer``) the outermost rows' within 1%, with (``depths``) the largest
    relative difference at each depth; only the rows ``timed`` says both clocks timed. The
    number of mismatches."""
    mine, theirs = rows_of(got), rows_of(want)
    keys = [k for k in theirs if k in mine and timed(k)]
    failures = 0
    short = []  # (how far below the floor, key)
    closest: Optional[Tuple[float, Key]] = None  # (report - run, per call), its row
    for k in keys:
        diff = mine[k]["total"] - theirs[k]["total"]
        per_call = diff / max(theirs[k]["count"], 1)
        if closest is None or per_call < closest[0]:
            closest = (per_call, k)
        if diff < -PER_CALL_SLACK * theirs[k]["count"]:
            short.append(k)
    failures += bool(short)
    near = f" (closest: {label(closest[1])}, {closest[0] * 1e6:+.3f} us a call)" if closest else ""
    print(
        f"  {'BAD' if short else 'ok '} {who}: each of {len(keys)} report totals >= the run's "
        f"- 1 us a call{near}"
        + (
            "; short: "
            + ", ".join(
                f"{label(k)} {mine[k]['total'] * 1e3:.3f} ms < {theirs[k]['total'] * 1e3:.3f} ms"
                for k in short[:4]
            )
            if short
            else ""
        )
    )
    worst: Dict[int, Tuple[float, Key]] = {}
    for k in keys:
        run = theirs[k]["total"]
        if run > 0:
            rel = (mine[k]["total"] - run) / run
            depth = theirs[k]["depth"]
            if depth not in worst or abs(rel) > abs(worst[depth][0]):
                worst[depth] = (rel, k)
    if outer:
        for k in (k for k in keys if theirs[k]["depth"] == 0):
            run, rep = theirs[k]["total"], mine[k]["total"]
            rel = (rep - run) / run if run > 0 else float("inf")
            ok = abs(rel) <= OUTER_LIMIT
            failures += not ok
            print(
                f"  {'ok ' if ok else 'BAD'} {who}: outermost {label(k)} report "
                f"{rep * 1e3:.3f} ms, run {run * 1e3:.3f} ms: {rel:+.4%} "
                f"(limit {OUTER_LIMIT:.0%})"
            )
    for depth in sorted(worst) if depths else ():
        rel, k = worst[depth]
        n = sum(1 for j in keys if theirs[j]["depth"] == depth)
        per_call = (mine[k]["total"] - theirs[k]["total"]) / max(theirs[k]["count"], 1)
        print(
            f"  note: {who}: depth {depth}, largest relative difference of {n} rows: "
            f"{rel:+.3%} ({label(k)}, {per_call * 1e6:+.1f} us a call)"
        )
    return failures


def check_view(python: str, platform: str, rep: str, folder: str) -> int:
    """Read report ``rep`` back (its .nsys-rep, then the .sqlite that wrote) and compare it with
    the run folder the same process saved; print a line per check; the number of mismatches."""
    who = f"{platform:3s} view"
    db = rep[: -len(".nsys-rep")] + ".sqlite"
    if os.path.exists(db):  # nsys stats' export: the view is to export its own
        os.remove(db)
    try:
        saved = view_json(python, folder)
        from_rep = view_json(python, rep)
        wrote = os.path.exists(db)
        print(
            f"  {'ok ' if wrote else 'BAD'} {who}: view REPORT.nsys-rep "
            + ("wrote REPORT.sqlite beside it" if wrote else "wrote no REPORT.sqlite beside it")
        )
        if not wrote:  # the .sqlite view still checked, on nsys's own export
            export = ["nsys", "export", "--type", "sqlite", "-f", "true", "-o", db, rep]
            subprocess.run(["timeout", "300", *export], capture_output=True, check=True)
        from_db = view_json(python, db)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"  BAD {who}: {e}")
        return 1
    failures = not wrote
    same = from_db["rows"] == from_rep["rows"]
    failures += not same
    print(
        f"  {'ok ' if same else 'BAD'} {who}: view REPORT.sqlite gives "
        + ("the same rows as" if same else "other rows than")
        + " view REPORT.nsys-rep"
    )
    failures += compare_rows(f"{who} vs run", from_rep, saved)
    failures += compare_totals(f"{who} vs run", from_rep, saved)
    return failures


def main(argv: List[str] = None) -> int:  # type: ignore[assignment]
    """Profile each platform, compare the counts and the tables; print a line per check."""
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
            rep, folder = profile(args.python, platform, args.epochs, workdir)
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
            failures += check_view(args.python, platform, rep, folder)
        if args.ranks:
            from nsys_ranks import check  # imports this module: not at the top

            failures += check(args.python, workdir)
    print("nsys check:", "passed" if not failures else f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
