"""Files written whole or not at all: a reader (``view``, a merge, a capture's client) never
sees half of one, and a job ended while saving leaves the last whole version."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

__all__ = ["write_whole"]


def write_whole(path: Union[str, "os.PathLike[str]"], data: Union[str, bytes]) -> Path:
    """Write ``data`` to ``path`` through a hidden temporary file beside it and
    ``os.replace`` (atomic on one file system); the temporary file is removed where writing
    fails (a full disk), and the error raised. Returns the path."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        os.replace(tmp, p)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    return p
