"""Reading a saved run's JSON: where it is, whether it is one, whether this version reads it.

A run saved by ``python -m instrumented_convs run`` is a folder holding ``run.json`` (see
:mod:`instrumented_convs.commands.launch.runs`, which writes it). This module imports nothing from
the package: :meth:`~instrumented_convs.report.Summary.load` and the launcher both read through it.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Dict, Union

__all__ = ["FORMAT", "VERSION", "RUN_FILE", "read"]

FORMAT = "instrumented_convs.run"  #: the ``format`` of every saved run
VERSION = 1  #: the newest run format this version writes and reads
RUN_FILE = "run.json"  #: a run folder's run (merged over ranks under torchrun)


def read(path: Union[str, "os.PathLike[str]"], runs_only: bool = True) -> Dict[str, Any]:
    """The JSON at ``path``: a run folder (its ``run.json``), a run or rank file, ``.gz``
    or not. With ``runs_only`` anything but a saved run is a ValueError; a run saved by a
    newer version always is one."""
    p = Path(path)
    if p.is_dir():
        if not (p / RUN_FILE).exists():
            ranks = sorted(p.glob("rank*.json"))
            hint = (
                f"; it has {len(ranks)} rank file(s): python -m instrumented_convs merge {p}"
                if ranks
                else ""
            )
            raise FileNotFoundError(f"{p} has no {RUN_FILE}{hint}")
        p = p / RUN_FILE
    raw = p.read_bytes()
    data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    is_run = isinstance(data, dict) and data.get("format") == FORMAT
    if runs_only and not is_run:
        raise ValueError(f"{p} is not a run saved by instrumented_convs")
    if is_run and data.get("version", 0) > VERSION:
        raise ValueError(
            f"{p} was saved by a newer instrumented_convs (run format {data['version']}; this "
            f"one reads up to {VERSION}): upgrade to read it"
        )
    return data
