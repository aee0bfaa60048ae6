"""The two-rank part of scripts/nsys_check.py: a torch.distributed job under one nsys.

One ``nsys profile`` around torchrun (``nsys profile ... python -m torch.distributed.run
--nproc-per-node 2 tests/dist_worker.py``), as docs/distributed.md shows: nsys follows the
launcher's children, so the report holds every rank's process. Each rank's ranges are
counted apart, by process, from the report's SQLite export (``NVTX_EVENTS``; a thread's
``globalTid`` holds its process id), and tied to their rank by what tests/dist_worker.py
does: rank r runs 3 + r epochs and 2 + r layer calls, and only the last rank a step
``only_last``.

Why not one nsys per rank (``torchrun --no-python nsys profile -o report.%q{RANK} ...``):
with Nsight Systems 2022.4 two nsys sessions at once on a loaded machine failed now and then
(one rank's nsys lost its own agent: "End of file", "Connection reset by peer"), where one
nsys around the job did not (docs/distributed.md has the counts).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from typing import Dict, List

from nsys_check import DOMAIN, ROOT, run_profiled

#: NVTX_EVENTS.eventType of a push/pop range, a start/end range, and a domain's creation
PUSH_POP, START_END, DOMAIN_CREATE = 59, 60, 75


def profile_job(python: str, workdir: str, ranks: int = 2) -> str:
    """Run tests/dist_worker.py on ``ranks`` processes under one nsys; the report's path."""
    worker = os.path.join(ROOT, "tests", "dist_worker.py")
    launch = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    out = os.path.join(workdir, "ranks")
    return run_profiled(out, [*launch, worker, workdir, "gloo"], OMP_NUM_THREADS="1")


def counts_by_process(rep: str) -> Dict[int, Dict[str, int]]:
    """Process id -> (range name in our domain -> instances), from the report's SQLite export."""
    db = rep[: -len(".nsys-rep")] + ".sqlite"
    subprocess.run(
        ["timeout", "300", "nsys", "export", "--type", "sqlite", "-f", "true", "-o", db, rep],
        capture_output=True,
        check=True,
    )
    con = sqlite3.connect(db)
    try:
        ours = {
            row[0]
            for row in con.execute(
                "SELECT domainId FROM NVTX_EVENTS WHERE eventType = ? AND text = ?",
                (DOMAIN_CREATE, DOMAIN),
            )
        }
        rows = con.execute(
            "SELECT (e.globalTid >> 24) & 16777215, COALESCE(e.text, s.value), e.domainId "
            "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON e.textId = s.id "
            "WHERE e.eventType IN (?, ?)",
            (PUSH_POP, START_END),
        ).fetchall()
    finally:
        con.close()
    out: Dict[int, Dict[str, int]] = {}
    for pid, name, domain in rows:
        if domain in ours:
            counts = out.setdefault(pid, {})
            counts[name] = counts.get(name, 0) + 1
    return out


def expected_rank(rank: int, ranks: int = 2) -> Dict[str, int]:
    """Range name -> instances in rank ``rank``'s process (tests/dist_worker.py's work)."""
    want = {
        "epoch": 3 + rank,
        "forward": 3 + rank,
        "layer": 2 + rank,
        "GCNConv": 2 + rank,
        "GCNConv [backward]": 2 + rank,
        "message": 2 + rank,
    }
    if rank == ranks - 1:
        want["only_last"] = 1
    return want


def check(python: str, workdir: str, ranks: int = 2) -> int:
    """Profile the job, print a line per rank and range; the number of mismatches."""
    by_pid = counts_by_process(profile_job(python, workdir, ranks))
    if len(by_pid) != ranks:
        print(f"  BAD {len(by_pid)} processes recorded our ranges, expected {ranks}: {by_pid}")
        return 1
    # the rank of a process: its epochs (3 + rank), checked against the rest below
    by_rank = {counts.get("epoch", 0) - 3: counts for counts in by_pid.values()}
    failures = 0
    for rank in range(ranks):
        got: Dict[str, int] = by_rank.get(rank, {})
        for name, n in sorted(expected_rank(rank, ranks).items()):
            ok = got.get(name) == n
            failures += not ok
            print(
                f"  {'ok ' if ok else 'BAD'} rank {rank} {DOMAIN}:{name:20s} expected "
                f"{n:3d}, nsys saw {got.get(name, 0)}"
            )
        extra: List[str] = sorted(set(got) - set(expected_rank(rank, ranks)))
        if "only_last" in extra:
            failures += 1
            print(f"  BAD rank {rank} ran only_last: the processes' ranges are mixed up")
    return failures
