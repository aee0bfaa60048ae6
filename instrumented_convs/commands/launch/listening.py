"""How a job on demand says that it listens, and how ``capture`` finds and talks to it.

A listening process makes a Unix socket in a folder only its user can enter, and announces
it twice: in its run folder (``listen.json``, ``listen.rank<N>.json`` under torchrun) and by
its pid in that folder of sockets, so that ``capture`` reaches a job by its run folder or by
any of its pids (a rank's, or the torchrun agent's). Nothing else is ever signalled: a
process that made no announcement is not touched. Messages are JSON, one a line.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

__all__ = [
    "ANNOUNCEMENT",
    "Announcement",
    "announcement_name",
    "alive",
    "announcements_in",
    "by_pid",
    "read_message",
    "sockets_folder",
    "started_at",
    "write_message",
]

ANNOUNCEMENT = "listen"  #: ``listen.json`` (or ``listen.rank<N>.json``) in a run folder
#: An announcement: ``pid``, ``started`` (its start in clock ticks since boot), ``ppid``,
#: ``socket``, ``folder``, ``rank``, ``world``, ``host``.
Announcement = Dict[str, Any]


def sockets_folder(create: bool = False) -> Path:
    """The folder of this user's sockets and pid announcements (``instrumented_convs-<uid>``
    in the temporary folder), only its owner may enter (made so with ``create``; refused
    where another user could write in it)."""
    folder = Path(tempfile.gettempdir()) / f"instrumented_convs-{os.getuid()}"
    if create:
        folder.mkdir(mode=0o700, exist_ok=True)
    if folder.exists():
        st = folder.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(
                f"{folder} is not this user's alone (owner {st.st_uid}, mode "
                f"{oct(st.st_mode & 0o777)}): remove it, or set TMPDIR elsewhere"
            )
    return folder


def started_at(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, from /proc; None: no such
    process, or not Linux): with its pid, a process no other can be taken for."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(ann: Announcement) -> bool:
    """Whether the process that announced ``ann`` still runs (the same process: its start)."""
    now = started_at(int(ann["pid"]))
    return now is not None and (ann.get("started") is None or now == ann["started"])


def announcement_name(rank: Optional[int]) -> str:
    """``listen.json``, or ``listen.rank<N>.json`` for a rank."""
    return f"{ANNOUNCEMENT}.json" if rank is None else f"{ANNOUNCEMENT}.rank{rank}.json"


def _read(path: Path) -> Optional[Announcement]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "socket" in data else None


def announcements_in(folder: Path) -> List[Announcement]:
    """The announcements in a run folder, by rank (one for a process alone)."""
    found = [_read(p) for p in sorted(folder.glob(f"{ANNOUNCEMENT}*.json"))]
    return sorted((a for a in found if a), key=lambda a: a.get("rank") or 0)


def by_pid(pid: int) -> Optional[Announcement]:
    """The announcement of process ``pid``, or of a process whose parent it is (the
    torchrun agent of a job's ranks); None where there is none."""
    try:
        folder = sockets_folder()
    except PermissionError:
        return None
    own = _read(folder / f"{pid}.json")
    if own is not None:
        return own if alive(own) else None  # (an earlier process of this pid's, killed)
    for path in sorted(folder.glob("*.json")):
        ann = _read(path)
        if ann is not None and ann.get("ppid") == pid and alive(ann):
            return ann
    return None


def write_message(conn: socket.socket, message: Dict[str, Any]) -> None:
    """Send ``message`` as a line of JSON."""
    conn.sendall((json.dumps(message) + "\n").encode())


def read_message(stream: Iterator[bytes]) -> Optional[Dict[str, Any]]:
    """The next message of ``stream`` (a socket's ``makefile("rb")``); None at its end."""
    for line in stream:
        line = line.strip()
        if line:
            return json.loads(line)
    return None
