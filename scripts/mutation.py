"""Mutation testing of the modules that make the numbers (issue 69): mutmut changes one thing
at a time in a module (an operator, a constant, a condition) and runs the tests that cover
it; a mutant the tests do not notice "survived". Each module must have at least 85% of its
mutants killed, and every survivor must be named in docs/testing.md with why it is
equivalent (or killed by a new test). Not in CI (it does not fit the 35 minutes with the rest).

    python scripts/mutation.py                       # every module below
    python scripts/mutation.py report/stats.py       # one (a path under instrumented_convs/)
    python scripts/mutation.py --survivors           # list each survivor and its diff

Run with the main environment's Python (``bash scripts/env.sh main``); mutmut lives in a
folder over it (``bash scripts/env.sh mutation``). Each module is mutated in a copy of this
working tree (``--work``), on the Python twin of the C fast path, one thread per process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]

#: Each module and the fast tests that check its numbers.
TARGETS: Dict[str, List[str]] = {
    "core/storage/entry.py": ["tests/test_core.py", "tests/test_statistics.py",
                              "tests/test_own_time.py", "tests/test_split.py",
                              "tests/test_speedups.py"],
    "report/stats.py": ["tests/test_summary_numbers.py", "tests/test_statistics.py",
                        "tests/test_report.py",
                        "tests/test_distributed.py", "tests/test_cuda_native.py",
                        "tests/test_counters.py", "tests/test_sampling.py"],
    # (not test_loader_shares.py: its waits add up within 20 us a reading, which coverage's
    # tracing of every line exceeds)
    "report/loaders.py": ["tests/test_loader_report.py", "tests/test_workers.py"],
    "report/hostdevice.py": ["tests/test_host_device_report.py"],
    "report/rules.py": ["tests/test_rules_items.py", "tests/test_advice.py",
                        "tests/test_trials.py"],
}  # fmt: skip
#: The least share of a module's mutants its tests must kill.
FLOOR = 0.85
#: Where the equivalent survivors are named (a line each: `mutant name`: why).
EXPLAINED = ROOT / "docs" / "testing.md"


def _files() -> List[str]:
    """The working tree's files (tracked and new, not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def _copy(work: Path) -> None:
    for name in _files():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, work / name)


def _config(module: str, tests: List[str]) -> str:
    """mutmut's section of pyproject.toml for ``module``."""
    also = sorted({f.split("/")[0] for f in _files()} - {"instrumented_convs"})
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["instrumented_convs"]\n'
        f'only_mutate = ["instrumented_convs/{module}"]\n'
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]\n'
        f"also_copy = {json.dumps(also)}\n"
    )


#: Started in each new interpreter: a test's child process, while mutmut collects which
#: tests reach which function, records its hits (lost with it) and so reads mutmut's
#: configuration, which it would look for in its own folder and fail: read it here from the
#: copy's. With a mutant under test the child runs the mutant, as the test's own process
#: does. (The tests' fork server runs without ``PYTHONPATH``, so children are real
#: interpreters here: ``INSTRUMENTED_CONVS_TESTS_FORK=0``.)
SITE = """import os
if os.environ.get("MUTANT_UNDER_TEST") == "stats":
    from mutmut.configuration import config
    _here = os.getcwd()
    os.chdir({work!r})
    try:
        config()
    finally:
        os.chdir(_here)
"""


def _mutmut(work: Path, *args: str) -> subprocess.CompletedProcess:
    folder = subprocess.run(
        ["bash", str(ROOT / "scripts" / "env.sh"), "mutation"], capture_output=True,
        text=True, check=True,
    ).stdout.strip()  # fmt: skip
    site = work / ".mutation-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE.format(work=str(work)))
    env = dict(
        os.environ, PYTHONPATH=f"{site}{os.pathsep}{folder}", INSTRUMENTED_CONVS_PURE_PYTHON="1",
        DGLBACKEND="pytorch", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
        INSTRUMENTED_CONVS_TESTS_FORK="0",
    )  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "mutmut", *args], cwd=work, env=env, capture_output=True,
        text=True,
    )  # fmt: skip


def explained() -> Dict[str, str]:
    """The survivors docs/testing.md names as equivalent, with why."""
    found = re.findall(r"^- `([\w.]+__mutmut_\d+)`: (.+)$", EXPLAINED.read_text(), re.M)
    return dict(found)


def mutate(module: str, work: Path, jobs: int) -> Tuple[Dict[str, int], List[str]]:
    """Mutate ``module`` in a copy at ``work``: mutmut's counts and the survivors' names."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    _copy(work)
    with open(work / "pyproject.toml", "a") as f:
        f.write(_config(module, TARGETS[module]))
    run = _mutmut(work, "run", "--max-children", str(jobs))
    if run.returncode != 0:
        tail = run.stdout[-3000:] + run.stderr[-3000:]
        raise RuntimeError(f"mutmut run failed for {module}:\n{tail}")
    _mutmut(work, "export-cicd-stats")
    stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
    results = _mutmut(work, "results").stdout
    survivors = re.findall(r"^\s*([\w.]+__mutmut_\d+): survived$", results, re.M)
    return stats, survivors


def main(argv: Optional[List[str]] = None) -> int:
    """Print each module's score and its survivors not explained; exit 1 where one falls
    short."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "modules", nargs="*", default=list(TARGETS), help="paths under instrumented_convs/"
    )
    p.add_argument("--work", default=None, help="where the copies go (default: a temporary one)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants at once")
    p.add_argument("--survivors", action="store_true", help="show each survivor's diff")
    args = p.parse_args(argv)
    unknown = [m for m in args.modules if m not in TARGETS]
    if unknown:
        p.error(f"not a module mutated here: {', '.join(unknown)} (one of {', '.join(TARGETS)})")
    base = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mutation-"))
    known = explained()
    short = False
    for module in args.modules:
        work = base / module.replace("/", "_").removesuffix(".py")
        stats, survivors = mutate(module, work, args.jobs)
        killed = stats["killed"] + stats["timeout"] + stats["segfault"]
        score = killed / max(stats["total"], 1)
        left = [s for s in survivors if s not in known]
        ok = score >= FLOOR and not left
        short |= not ok
        print(
            f"{module}: {killed} of {stats['total']} mutants killed ({score:.1%}), "
            f"{len(survivors)} survived, {len(survivors) - len(left)} of them explained in "
            f"docs/testing.md{'' if ok else '  <- short'}",
            flush=True,
        )
        for name in left:
            print(f"  survived: {name}")
            if args.survivors:
                print(_mutmut(work, "show", name).stdout)
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
