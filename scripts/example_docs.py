"""Run each example and write its docs page (docs/examples/*.md) with the output it printed.

    python scripts/example_docs.py [--only arxiv cora aggnet compare]

Each page states the command, the machine and the library versions, so a reader can tell
what produced the numbers. The study is a published profiling of a 3-layer GCN on ogbn-arxiv
and Cora with PyG and DGL (which timed the layers' internal steps by copying the layers' source
and inserting timers); the examples run it with the instrumented layers. The compare page uses
``--with-sparse``: run this script with an interpreter that has torch-sparse. Progress bars
are off; stderr (warnings) is not included.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "examples")

PAGES: Dict[str, Tuple[str, str, List[List[str]]]] = {
    "arxiv": (
        "ogbn-arxiv study (examples/arxiv.py)",
        "The study's 3-layer GCN on a generated graph of ogbn-arxiv's shape, with PyG (edge_index "
        "and SparseTensor input) and DGL. The study ran 100 epochs; on this 2-core CPU machine "
        "the pages use 10 (PyG's edge_index path takes about 4 s per epoch here).",
        [
            ["examples/arxiv.py", "--platform", "pyg", "--epochs", "10"],
            ["examples/arxiv.py", "--platform", "pyg", "--sparse", "--epochs", "10"],
            ["examples/arxiv.py", "--platform", "dgl", "--epochs", "10"],
        ],
    ),
    "cora": (
        "Cora study (examples/cora.py)",
        "The study's Cora GCN (GCNConv, ReLU, GCNConv, ReLU, GCNConv, log_softmax) on a generated "
        "graph of Cora's shape, 100 epochs.",
        [["examples/cora.py", "--platform", "pyg"], ["examples/cora.py", "--platform", "dgl"]],
    ),
    "aggnet": (
        "AGGNet augmentation loop (examples/aggnet.py)",
        "The study's graph-augmentation loop (GraphSAINT with MH-Aug) with its 2-hop GraphConv "
        "AGGNet, 20 iterations on a "
        "generated Cora-shaped graph.",
        [["examples/aggnet.py"]],
    ),
    "compare": (
        "PyG vs DGL side by side (python -m instrumented_convs compare)",
        "The arxiv study for each framework on the generated ogbn-arxiv-shaped graph (3 timed "
        "epochs each, after 1 warm-up), then one table aligned by role, and a stacked bar chart "
        "(`--plot`). `python -m instrumented_convs demo` runs the same study (without "
        "`--with-sparse`, which needs torch-sparse) and prints each framework's tables first.",
        [
            [
                "-m",
                "instrumented_convs",
                "compare",
                "--with-sparse",
                "--brief",
                "--plot",
                "docs/compare.png",
            ]
        ],
    ),
}


def _versions() -> str:
    parts = [f"Python {platform.python_version()}"]
    for pkg in ("torch", "torch-geometric", "torch-sparse", "dgl", "nvtx"):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            pass
    return ", ".join(parts)


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def write_page(name: str) -> str:
    """Run the page's commands and write docs/examples/<name>.md; return its path."""
    title, intro, commands = PAGES[name]
    rest = os.environ.get("PYTHONPATH")  # keep the folders over the environment (torch-sparse)
    env = dict(
        os.environ, PYTHONPATH=ROOT + (os.pathsep + rest if rest else ""), DGLBACKEND="pytorch"
    )
    lines = [
        f"# {title}",
        "",
        intro,
        "",
        f"Machine: {_machine()}; {_versions()}; {datetime.date.today().isoformat()}.",
        "",
    ]
    for cmd in commands:
        shown = "python " + " ".join(cmd)
        proc = subprocess.run(
            [sys.executable, *cmd, "--no-progress"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{shown} failed:\n{proc.stderr}")
        lines += ["```text", f"$ {shown}", proc.stdout.rstrip(), "```", ""]
    if name == "compare":
        lines += ["![time per epoch by role](../compare.png)", ""]
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"{name}.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines))
    return path


def main() -> int:
    """Write the selected pages."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", nargs="+", choices=sorted(PAGES), default=sorted(PAGES))
    args = p.parse_args()
    for name in args.only:
        print(write_page(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
