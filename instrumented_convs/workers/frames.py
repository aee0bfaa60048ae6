"""How a loader worker's records reach the training process: each worker appends one frame a
batch (a length-prefixed pickle of plain data, in one ``write``) to its own file, before the
batch is handed over. A worker killed mid-write leaves a short last frame, which :func:`read`
drops. Imports nothing from the package.
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path
from typing import Any, Dict, Iterator, List

__all__ = ["SUFFIX", "Writer", "read", "files"]

SUFFIX = ".frames"
_HEAD = struct.Struct("<I")  # each frame: its length, then its pickle


class Writer:
    """Appends frames to ``folder/worker-<pid>.frames`` (created on the first frame)."""

    def __init__(self, folder: "str | os.PathLike[str]") -> None:
        """A writer for this process's file in ``folder``."""
        self.path = Path(folder) / f"worker-{os.getpid()}{SUFFIX}"
        self._fd = -1

    def write(self, frame: Dict[str, Any]) -> None:
        """Append ``frame`` (plain data) in one ``write``."""
        body = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self._fd, _HEAD.pack(len(body)) + body)

    def close(self) -> None:
        """Close the file (frames written stay)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read(path: "str | os.PathLike[str]") -> List[Dict[str, Any]]:
    """Every whole frame of a worker's file, in the order written (a short last one, from a
    worker killed while writing it, is left out)."""
    data = Path(path).read_bytes()
    out, at = [], 0
    while at + _HEAD.size <= len(data):
        (n,) = _HEAD.unpack_from(data, at)
        if at + _HEAD.size + n > len(data):
            break
        out.append(pickle.loads(data[at + _HEAD.size : at + _HEAD.size + n]))
        at += _HEAD.size + n
    return out


def files(folder: "str | os.PathLike[str]") -> Iterator[Path]:
    """The workers' files in ``folder``, oldest first."""
    found = sorted(Path(folder).glob(f"worker-*{SUFFIX}"), key=lambda p: p.stat().st_mtime_ns)
    return iter(found)
