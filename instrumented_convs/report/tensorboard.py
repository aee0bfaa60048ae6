"""A summary as TensorBoard scalars (``summary.to_tensorboard(writer, step)``), so that each
step's time per call can be followed epoch by epoch beside the training's own curves.
Nothing here imports TensorBoard.
"""

from __future__ import annotations

import re
import weakref
from typing import Any, Dict, Optional, Tuple

__all__ = ["write_scalars", "tag_of", "SECTIONS"]

#: The sections (TensorBoard's groups of charts), by what they show.
SECTIONS = {
    "time": "instrumented_convs ms per call",
    "calls": "instrumented_convs calls",
    "flops": "instrumented_convs GFLOP per s",
    "bytes": "instrumented_convs GB per s",
}

_Key = Tuple[str, str, Optional[str], Optional[str]]  # a row: path, phase, scope, relation
_Point = Tuple[float, float, int, int]  # its count, total seconds, FLOPs, bytes at a point
_previous: "weakref.WeakKeyDictionary[Any, Dict[_Key, _Point]]" = weakref.WeakKeyDictionary()
_ILLEGAL = re.compile(r"[^A-Za-z0-9_./\-]+")


def tag_of(section: str, name: str, phase: str = "forward", scope: Optional[str] = None) -> str:
    """The tag of a row's scalar in ``section`` (a key of :data:`SECTIONS`)."""
    path = "/".join(_ILLEGAL.sub("_", part).strip("_") or "_" for part in name.split("/"))
    if phase == "backward":
        path += ".backward"
    if scope:
        path += "." + _ILLEGAL.sub("_", scope).strip("_")
    return f"{_ILLEGAL.sub('_', SECTIONS[section])}/{path}"


def write_scalars(summary: Any, writer: Any, step: Optional[int] = None) -> int:
    """Write ``summary``'s rows to ``writer`` as scalars at ``step``; returns the number of
    scalars written.

    Each call writes one point per row: the mean time per call of the calls made since the
    writer's previous point (the first point: since the start), in milliseconds, under
    ``instrumented_convs ms per call/<path>``; with the counters on, the FLOP/s and bytes/s
    those calls achieved (``instrumented_convs GFLOP per s``, ``instrumented_convs GB per s``);
    and the calls themselves (``instrumented_convs calls``). A row without new calls since the
    last point gets no point (its curve does not pretend it ran). A backward row's path ends in
    ``.backward``; grouped by layer, ``.<scope>`` follows the path.

    TensorBoard's tags take letters, digits and ``_ . / -``: a path's other characters become
    ``_`` (``forward (no grad)`` is ``forward_no_grad``). The writer is anything with
    ``add_scalar(tag, value, global_step)`` (``torch.utils.tensorboard.SummaryWriter``, a
    Lightning ``TensorBoardLogger``'s ``experiment``); nothing here imports TensorBoard.
    """
    try:
        before = _previous.get(writer, {})
    except TypeError:  # a writer that takes no weak reference: every point since the start
        before = {}
    now: Dict[_Key, _Point] = {}
    written = 0
    for row in summary:
        key = row.key
        now[key] = (row.count, row.total, row.flops, row.bytes_read + row.bytes_written)
        count0, total0, flops0, bytes0 = before.get(key, (0, 0.0, 0, 0))
        if row.count < count0:  # the registry was reset since: from that reset on
            count0, total0, flops0, bytes0 = 0, 0.0, 0, 0
        calls, seconds = row.count - count0, row.total - total0
        if calls <= 0:
            continue
        scalars = {"time": 1e3 * seconds / calls, "calls": calls}
        if row.ops and seconds > 0:
            scalars["flops"] = (row.flops - flops0) / seconds / 1e9
            scalars["bytes"] = (now[key][3] - bytes0) / seconds / 1e9
        for section, value in scalars.items():
            writer.add_scalar(
                tag_of(section, row.name, row.phase, row.scope or row.relation), value, step
            )
            written += 1
    try:
        _previous[writer] = now
    except TypeError:
        pass
    return written
