"""Make the pictures of docs/run.md from a real run: the page, and the timeline in Perfetto.

    python scripts/doc_pictures.py --python MAIN/bin/python     # in the viewer environment

Runs ``tests/scripts/plain_pyg.py``, copied as ``train.py`` into a folder of its own, under
``instrumented-convs run --advise`` (a console script as pip writes it, for the given Python:
the main environment), so that the page shows the command as a user types it; then
screenshots, with Debian's headless chromium, the run's page.html (docs/run_page.png) and one
training step of its timeline opened in Perfetto's UI (docs/run_perfetto.png; see
perfetto_check.py), checked as that script checks it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from perfetto_check import expected, open_in_perfetto

ROOT = Path(__file__).resolve().parents[1]

#: The console script pip writes for setup.cfg's entry point, for ``python``.
CONSOLE_SCRIPT = """#!{python}
import re
import sys
from instrumented_convs.__main__ import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""


def one_step(trace: dict, n: int = 3) -> dict:
    """The part of ``trace`` after the (n-1)-th optimizer step up to the end of the n-th: one
    training step (and the evaluation before it), from data to ``optimizer.step``."""
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    ends = sorted(e["ts"] + e["dur"] for e in x if e["name"] == "optimizer.step")
    n = min(n, len(ends) - 1)
    t0, t1 = ends[n - 1], ends[n]
    keep = [e for e in trace["traceEvents"] if e["ph"] == "M" or ("ts" in e and t0 < e["ts"] <= t1)]
    ids = {e["id"] for e in keep if e["ph"] == "s"} & {e["id"] for e in keep if e["ph"] == "f"}
    keep = [e for e in keep if e["ph"] not in ("s", "f") or e["id"] in ids]
    return dict(trace, traceEvents=keep)


def main() -> int:
    """Make both pictures; exit code 1 if Perfetto does not read the step as written."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="the main environment's python")
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir, work = Path(tmp) / "bin", Path(tmp) / "gnn"
        bin_dir.mkdir()
        work.mkdir()
        console = bin_dir / "instrumented-convs"
        console.write_text(CONSOLE_SCRIPT.format(python=args.python))
        console.chmod(0o755)
        (work / "train.py").write_text((ROOT / "tests" / "scripts" / "plain_pyg.py").read_text())
        path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PATH=path)
        command = "instrumented-convs run --advise --warmup 2 -o runs/gcn train.py --epochs 6"
        subprocess.run(command.split(), check=True, env=env, cwd=work, timeout=600)
        run = work / "runs" / "gcn"
        page_png = args.out / "run_page.png"
        subprocess.run(
            [
                "timeout",
                "60",
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={tmp}/profile",
                "--window-size=1280,1000",
                f"--screenshot={page_png}",
                (run / "page.html").as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=90,
        )
        trace = json.loads(gzip.decompress((run / "trace.json.gz").read_bytes()))
        step = one_step(trace)
        step_file = Path(tmp) / "step.json"
        step_file.write_text(json.dumps(step))
        got = open_in_perfetto(step_file, args.out / "run_perfetto.png")
    want = expected(step)
    print(f"pictures: {page_png}, {args.out / 'run_perfetto.png'}")
    print(f"Perfetto read {got['found']}; the step holds {want}")
    return 0 if got["found"] == want and not got["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
