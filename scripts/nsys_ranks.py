"""The two-rank part of scripts/nsys_check.py: a torch.distributed job under one nsys.

One ``nsys profile`` around torchrun (``nsys profile ... python -m torch.distributed.run
--nproc-per-node 2 tests/dist_worker.py``), as docs/distributed.md shows: nsys follows the
launcher's children, so the report holds every rank's process. Each rank's ranges are
counted apart, by process, from the report's SQLite export (``NVTX_EVENTS``; a thread's
``globalTid`` holds its process id), and tied to their rank by what tests/dist_worker.py
does: rank r runs 3 + r epochs and 2 + r layer calls, and only the last rank a step
``only_last``.

The report is then read back with ``view`` as the merged table of both processes and as each
``--rank K`` apart: the merged rows (and how many ranks ran each) as the ranks merged them in
process, each rank's rows and counts as nsys counted its process's ranges and as that rank
saved its own table (``mine`` in tests/dist_worker.py's ``rank<r>.json``), and the totals of
the rows the real clock timed (``layer`` and under: the epochs ran on a fake clock) as
scripts/nsys_check.py compares a run's. ``view`` numbers the processes by process id, which
need not be torchrun's rank order: a rank is known by its epochs here too.

Why not one nsys per rank (``torchrun --no-python nsys profile -o report.%q{RANK} ...``):
with Nsight Systems 2022.4 two nsys sessions at once on a loaded machine failed now and then
(one rank's nsys lost its own agent: "End of file", "Connection reset by peer"), where one
nsys around the job did not (docs/distributed.md has the counts).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from typing import Any, Dict, List

from nsys_check import DOMAIN, ROOT, compare_rows, compare_totals, rows_of, run_profiled, view_json

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
    """Profile the job, print a line per rank and range, and check the report read back
    (:func:`check_view`); the number of mismatches."""
    rep = profile_job(python, workdir, ranks)
    by_pid = counts_by_process(rep)
    return check_counts(by_pid, ranks) + check_view(python, rep, by_pid, workdir, ranks)


def check_counts(by_pid: Dict[int, Dict[str, int]], ranks: int = 2) -> int:
    """Print a line per rank and range of ``by_pid`` against what each rank did; the number of
    mismatches."""
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


def counts_of(table: Dict[str, Any]) -> Dict[str, int]:
    """Range name (``<step> [backward]`` for a backward step's) -> calls, from a table's rows."""
    out: Dict[str, int] = {}
    for r in table["rows"]:
        name = r["step"] + (" [backward]" if r["phase"] == "backward" else "")
        out[name] = out.get(name, 0) + r["count"]
    return out


def check_view(
    python: str, rep: str, by_pid: Dict[int, Dict[str, int]], workdir: str, ranks: int = 2
) -> int:
    """Read the report back with ``view``, merged and ``--rank K`` apart, against the counts
    nsys saw (``by_pid``) and the tables the ranks saved in ``workdir``; print a line per
    check; the number of mismatches."""
    try:
        merged = view_json(python, rep)
        apart = [view_json(python, rep, "--rank", str(k)) for k in range(ranks)]
        saved = []
        for r in range(ranks):
            with open(os.path.join(workdir, f"rank{r}.json")) as f:
                saved.append(json.load(f))
    except (RuntimeError, OSError, ValueError) as e:
        print(f"  BAD ranks view: {e}")
        return 1
    failures = 0
    seen: List[int] = []
    for k, table in enumerate(apart):
        got = counts_of(table)
        rank = got.get("epoch", 0) - 3  # rank r ran 3 + r epochs
        seen.append(rank)
        pid = [p for p, c in by_pid.items() if c.get("epoch", 0) - 3 == rank]
        want = expected_rank(rank, ranks)
        ok = (
            0 <= rank < ranks
            and len(pid) == 1
            and got == by_pid[pid[0]]
            and all(got.get(n) == c for n, c in want.items())
        )
        failures += not ok
        print(
            f"  {'ok ' if ok else 'BAD'} ranks view --rank {k}: rank {rank}'s process, "
            f"{sum(got.values())} calls"
            + (" as nsys counted them" if ok else f": {got}, expected {want} (nsys: {by_pid})")
        )
        if not 0 <= rank < ranks:
            continue
        mine = saved[rank]["mine"]
        who = f"ranks view --rank {k} vs rank {rank}'s own table"
        failures += compare_rows(who, table, mine)
        real = lambda key: key[0].startswith("layer")  # noqa: E731  (the rest: a fake clock)
        failures += compare_totals(who, table, mine, real, outer=False, depths=False)
    if sorted(seen) != list(range(ranks)):
        failures += 1
        print(f"  BAD ranks view: --rank 0..{ranks - 1} gave the ranks {seen}")
    elif seen != list(range(ranks)):
        print(f"  note: ranks view: --rank K (by process id) gave the ranks {seen}")
    total: Dict[str, int] = {}
    for counts in by_pid.values():
        for name, n in counts.items():
            total[name] = total.get(name, 0) + n
    got = counts_of(merged)
    ok = len(merged.get("per_rank") or []) == ranks and got == total
    failures += not ok
    print(
        f"  {'ok ' if ok else 'BAD'} ranks view: merged, {len(merged.get('per_rank') or [])} "
        f"processes of {ranks}, {sum(got.values())} calls"
        + (" as nsys counted them" if got == total else f" where nsys counted {total}")
    )
    theirs = saved[0]["merged"]  # as rank 0 printed it
    if seen != list(range(ranks)):  # merged in another order: its rows' order is not checked
        order = {key: i for i, key in enumerate(rows_of(theirs))}
        merged = dict(
            merged,
            rows=sorted(
                merged["rows"], key=lambda r: order.get((r["name"], r["phase"]), len(order))
            ),
        )
    return failures + compare_rows(
        "ranks view merged vs in process", merged, theirs, ("kind", "ranks")
    )
