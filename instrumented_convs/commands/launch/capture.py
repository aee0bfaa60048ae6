"""``capture TARGET [--iterations N]``: ask a job started on demand (``run --on-demand``,
``configure(record="on-demand")``, Lightning's ``ConvProfiler(record="on-demand")``) to
record its next N iterations, wait until the job has written them as a run folder inside its
own, and print that folder's path.

TARGET is the job's run folder or a pid (a rank's, or the torchrun agent's). Under torchrun
every rank is asked for the same iterations: the first one a little ahead of the furthest
rank (about a second at the pace they go), and rank 0 writes the merged folder.
"""

from __future__ import annotations

import argparse
import logging
import math
import socket
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ...report import RUN_FILE
from ..errors import USAGE, UserError
from .listening import (
    Announcement,
    alive,
    announcements_in,
    by_pid,
    read_message,
    started_at,
    write_message,
)

__all__ = ["capture_main", "LEAD"]

logger = logging.getLogger(__name__)

#: Seconds ahead of the furthest rank a torchrun job's capture begins (at the ranks' pace).
LEAD = 1.0
_ASK = "start a job that listens: run --on-demand, or configure(record='on-demand') in it"


def capture_main(args: argparse.Namespace) -> int:
    """``capture``: find the job, ask every process of it, wait, print the folder."""
    if args.iterations < 1:
        raise UserError("--iterations takes a positive number", USAGE)
    if args.timeout is not None and args.timeout <= 0:
        raise UserError("--timeout takes a positive number of seconds", USAGE)
    anns = find(args.target)
    folder = Path(anns[0]["folder"])
    talks, name = _arm(anns, args.iterations, folder)
    who = (
        f"ranks {', '.join(str(a['rank']) for a in anns)}"
        if anns[0]["world"]
        else f"pid {anns[0]['pid']}"
    )
    logger.info("capture: %s asked for %d iterations: %s", who, args.iterations, folder / name)
    try:
        done = _wait(talks, args.timeout)
    except KeyboardInterrupt:
        if _cancel(anns, name, folder):
            logger.info("capture: interrupted: %s cancelled, nothing written", name)
        else:
            logger.info("capture: interrupted: %s was being written already", folder / name)
        return 130
    except TimeoutError:
        c = _status(anns[0]).get("capture") or {}
        raise UserError(
            f"--timeout {args.timeout:g}: {name} is not written yet ({_busy(c) if c else name}); "
            f"the job goes on and writes it in {folder / name}"
        ) from None
    finally:
        for conn, _ in talks:
            conn.close()
    return _report(done, anns, folder / name, args)


def find(target: str) -> List[Announcement]:
    """The announcements of the job ``target`` names (its run folder, or a pid), one per
    process, every one alive; else a :class:`UserError` saying what ``target`` is."""
    path = Path(target)
    if target.isdigit() and not path.exists():
        pid = int(target)
        ann = by_pid(pid)
        if ann is None:
            if started_at(pid) is None and not Path(f"/proc/{pid}").exists():
                raise UserError(f"{target}: no process {pid} (and no such folder)", USAGE)
            raise UserError(f"process {pid}{_command(pid)} does not listen for captures: {_ASK}")
        anns = announcements_in(Path(ann["folder"])) or [ann]
    elif path.is_dir():
        anns = announcements_in(path)
        if not anns:
            ended = (path / RUN_FILE).exists()
            raise UserError(
                f"{target}: its job has ended ({RUN_FILE} is written): nothing listens there"
                if ended
                else f"{target}: no job listens for captures here: {_ASK}"
            )
    else:
        raise UserError(f"{target}: no such run folder or process id", USAGE)
    gone = [a for a in anns if not alive(a)]
    if gone:
        raise UserError(
            f"{target}: the job that listened there (pid {gone[0]['pid']}) has ended: "
            "nothing to capture"
        )
    world = anns[0].get("world")
    if world:
        missing = sorted(set(range(world)) - {a.get("rank") for a in anns})
        if missing:
            raise UserError(f"{target}: ranks {missing} of {world} do not listen (yet?): try again")
    return anns


def _command(pid: int) -> str:
    """`` (python train.py)``: the process's command line, where /proc tells."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    words = [w.decode(errors="replace") for w in raw.split(b"\0") if w]
    return f" ({' '.join(words)[:80]})" if words else ""


Talk = Tuple[socket.socket, Iterator[bytes]]


def _talk(ann: Announcement, message: Dict[str, Any], timeout: float = 10.0) -> Tuple[Talk, Dict]:
    """Send ``message`` to the process of ``ann``: the open connection and its first answer."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(ann["socket"])
        write_message(conn, message)
        stream = conn.makefile("rb")
        reply = read_message(stream)
    except OSError as e:
        conn.close()
        raise UserError(f"pid {ann['pid']} does not answer on {ann['socket']}: {e}") from None
    if reply is None:
        conn.close()
        raise UserError(f"pid {ann['pid']} closed the connection without an answer")
    conn.settimeout(None)
    return (conn, stream), reply


def _status(ann: Announcement) -> Dict[str, Any]:
    (conn, _), reply = _talk(ann, {"op": "status"})
    conn.close()
    if not reply.get("on"):
        raise UserError(f"pid {ann['pid']} is not on demand now: nothing to capture")
    return reply


def _start(anns: List[Announcement]) -> Optional[int]:
    """The iteration every rank begins the capture at (None for a process alone: its next):
    :data:`LEAD` seconds ahead of the furthest rank at the fastest rank's pace, and at least
    two iterations ahead. Ranks whose counts of iterations lie further apart than their pace
    explains (a ``registry.reset()`` on some of them) are said to record apart."""
    if not anns[0].get("world"):
        return None
    before = [_status(a) for a in anns]
    time.sleep(0.25)
    after = [_status(a) for a in anns]
    for s in after:
        if s.get("capture"):
            raise UserError(f"a capture is under way in rank {s['rank']}: {_busy(s['capture'])}")
    rate = max((b["i"] - a["i"]) / max(b["time"] - a["time"], 1e-3) for a, b in zip(before, after))
    counts = [s["i"] for s in after]
    apart = max(s["time"] for s in after) - min(s["time"] for s in after)
    if max(counts) - min(counts) > 2 + rate * apart:
        logger.warning(
            "capture: the ranks count their iterations apart (%s, rank by rank): each "
            "records from iteration %d by its own count, not the same iterations",
            ", ".join(map(str, counts)),
            max(counts),
        )
    return max(counts) + max(2, math.ceil(rate * LEAD))


def _busy(c: Dict[str, Any]) -> str:
    if c["state"] == "recording":
        return f"{c['name']}, {c['recorded']} of {c['iterations']} iterations recorded"
    return f"{c['name']}, {c['state']}"


def _claim(folder: Path) -> str:
    """A new capture folder's name in the job's folder (``capture-1``, ``capture-2``...),
    made here so that no two captures share one."""
    for n in range(1, 100_000):
        name = f"capture-{n}"
        try:
            (folder / name).mkdir()
            return name
        except FileExistsError:
            continue
    raise UserError(f"{folder} holds too many captures")


def _arm(anns: List[Announcement], iterations: int, folder: Path) -> Tuple[List[Talk], str]:
    """Ask every process for the capture (a start a torchrun job's ranks agree on): the
    connections, each waiting for its capture's folder, and the capture's name. A rank too
    near the start when asked makes every rank drop it and the ask come again further ahead;
    whatever ends the asking early (an error, Ctrl-C) takes back what was asked."""
    for attempt in range(3):
        start = _start(anns)
        if start is not None and attempt:
            start += attempt * 8
        name = _claim(folder)
        talks: List[Talk] = []
        refused = []
        try:
            for ann in anns:
                msg = {"op": "capture", "iterations": iterations, "start": start, "name": name}
                talk, reply = _talk(ann, msg)
                if reply.get("ok"):
                    talks.append(talk)
                else:
                    talk[0].close()
                    refused.append(reply)
        except BaseException:
            _drop(talks, anns, name, folder)
            raise
        if not refused:
            return talks, name
        _drop(talks, anns, name, folder)
        if not all(r.get("late") for r in refused):
            who = f"rank {refused[0]['rank']}" if refused[0].get("world") else "the job"
            raise UserError(f"{who} cannot take a capture now: {refused[0]['error']}")
    raise UserError("the ranks went past every start asked of them: try again")


def _drop(talks: List[Talk], anns: List[Announcement], name: str, folder: Path) -> None:
    """Close the connections, cancel the capture wherever it was taken, give its folder back."""
    for conn, _ in talks:
        conn.close()
    _cancel(anns, name, folder)


def _cancel(anns: List[Announcement], name: str, folder: Path) -> bool:
    """Cancel the capture ``name`` in every process, its folder given back; whether every
    process still had it to cancel (none was writing it already)."""
    cancelled = True
    for ann in anns:
        try:
            (conn, _), reply = _talk(ann, {"op": "cancel", "name": name}, timeout=5.0)
            conn.close()
            cancelled = cancelled and bool(reply.get("cancelled"))
        except UserError:
            continue
    try:
        (folder / name).rmdir()  # (empty, unless a process was writing it already)
    except OSError:
        pass
    return cancelled


def _wait(talks: List[Talk], timeout: Optional[float]) -> List[Optional[Dict[str, Any]]]:
    """Each process's last word on the capture (None: it ended without one); raises
    :class:`TimeoutError` after ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    done = []
    for conn, stream in talks:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        conn.settimeout(left)
        try:
            done.append(read_message(stream))
        except (socket.timeout, TimeoutError):
            raise TimeoutError from None
        except OSError:
            done.append(None)
    return done


def _report(
    done: List[Optional[Dict[str, Any]]],
    anns: List[Announcement],
    folder: Path,
    args: argparse.Namespace,
) -> int:
    """Print the folder (stdout) and what is short of what was asked (stderr): 0 when every
    iteration was written, 1 otherwise."""
    lost = [a["pid"] for a, d in zip(anns, done) if d is None]
    if lost:
        raise UserError(f"the job ended (pid {lost[0]}) before {folder} was written")
    failed = [d for d in done if d is not None and not d.get("ok")]
    if failed and not (folder / RUN_FILE).exists():
        raise UserError(f"{folder} was not written: {failed[0].get('error')}")
    print(folder)
    for d in failed:  # a rank that missed the start: the others' files are merged
        logger.warning("capture: rank %s: %s: merged without it", d.get("rank"), d.get("error"))
    short = [d["capture"] for d in done if d and d.get("ok") and not d["capture"]["complete"]]
    for c in short[:1]:
        logger.warning(
            "capture: %s holds %d of the %d iterations asked (%s)",
            folder,
            c["recorded"],
            args.iterations,
            c.get("reason") or "cut short",
        )
    return 1 if failed or short else 0
