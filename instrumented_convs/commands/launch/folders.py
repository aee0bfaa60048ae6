"""Which torchrun rank this is, and the default run folder, claimed so that no run overwrites
another's, not even one started in the same second or a torchrun job's (whose ranks share
one folder without talking to each other): :func:`default_folder`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterator, Optional, Tuple

__all__ = ["JOB_FILE", "job_rank", "default_folder"]

JOB_FILE = ".job"  #: in a torchrun job's default folder: the job it belongs to


def job_rank() -> tuple:
    """``(rank, world_size)`` from torchrun's environment; ``(None, None)`` outside one."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None, None


def _agent() -> Optional[Tuple[int, float]]:
    """This process's parent (the torchrun agent): its pid and when it started, from
    ``/proc`` (Linux; None elsewhere)."""
    pid = os.getppid()
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return pid, int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return None


def _candidates(base: Path) -> Iterator[Path]:
    yield base
    n = 1
    while True:
        n += 1
        yield base.with_name(f"{base.name}-{n}")


def _claim(base: Path) -> Path:
    """The first of ``base``, ``base-2``, ... that this call creates."""
    base.parent.mkdir(parents=True, exist_ok=True)
    for folder in _candidates(base):
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _job_of(folder: Path, patience: float) -> Optional[str]:
    """The job named in ``folder``'s :data:`JOB_FILE`, or None. A job's folder gets its file
    first, a moment after it is made: a folder with nothing else in it, made less than
    ``patience`` seconds ago, is waited for."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return (folder / JOB_FILE).read_text()
        except FileNotFoundError:
            pass
        except OSError:
            return None
        try:
            young = time.time() - folder.stat().st_mtime < patience and not any(
                not p.name.startswith(JOB_FILE) for p in folder.iterdir()
            )
        except OSError:
            return None
        if not young or time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def _claim_for(base: Path, job: str, patience: float = 0.5) -> Path:
    """The first of ``base``, ``base-2``, ... that is ``job``'s: made by this call (then
    ``job`` is written in its :data:`JOB_FILE`) or by another rank of the job."""
    base.parent.mkdir(parents=True, exist_ok=True)
    for folder in _candidates(base):
        try:
            folder.mkdir()
        except FileExistsError:
            if _job_of(folder, patience) == job:
                return folder
            continue
        tmp = folder / f"{JOB_FILE}.{os.getpid()}.tmp"
        tmp.write_text(job)
        os.replace(tmp, folder / JOB_FILE)  # whole, never half written
        return folder
    raise AssertionError("unreachable")


def default_folder(target: str, started: float, root: str = "ic-runs") -> Path:
    """``ic-runs/<script>-<YYYYmmdd-HHMMSS>`` (or ``-2``, ``-3``...), created: a folder no
    other run has. The ranks of one torchrun job name it after the agent's start and share
    it.

    A run without ``-o`` saves in ``ic-runs/<script>-<YYYYmmdd-HHMMSS>`` (its start), or with a
    suffix ``-2``, ``-3``... when that name is taken: the folder is claimed by creating it
    (``mkdir`` fails when it exists, atomically), so runs that start in the same second, and end
    at the same moment too, get folders of their own.

    The ranks of a torchrun job share one folder without talking to each other (they have no
    process group at the end, or no longer one): its name comes from the start time of their
    parent, the torchrun agent (Linux; elsewhere pass ``-o``). The rank that creates it writes a
    ``.job`` file there first, naming the job (the agent's pid and start time); a rank takes the
    first folder of that name and its suffixes that it creates or whose ``.job`` names its job.
    Another job started in the same second finds another job there and moves on, every rank of
    it in the same order; a run outside torchrun leaves no ``.job``, so no job takes its folder.
    """
    stem = Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]
    _, world = job_rank()
    agent = _agent() if world is not None else None
    at = started if agent is None else agent[1]
    base = Path(root) / f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(at))}"
    if agent is None:
        return _claim(base)
    return _claim_for(base, f"torchrun agent {agent[0]} started {agent[1]!r}\n")
