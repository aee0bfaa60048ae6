"""Host and device on CUDA: per region, per layer and for the steps that cost the host most,
whether the device waited for the host (launch-bound) or the host ran ahead of it
(device-bound), read from the rows' host time, end lags and calls caught up. The rule and its
limits are in docs/host_device.md. It only reads rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from ..core.storage.entry import BACKWARD_MARK
from .columns import choose_unit
from .row import host_estimate

__all__ = [
    "LAUNCH_BOUND",
    "DEVICE_BOUND",
    "HOST_HEAVY",
    "MOST_NAMED",
    "Part",
    "parts",
    "host_device",
    "lines",
]

#: The share of calls caught up from which a part is launch-bound (the device waited).
LAUNCH_BOUND = 0.8
#: The share of calls caught up up to which a part is device-bound (the host ran ahead).
DEVICE_BOUND = 0.2
#: A step whose host time is at least this share of its device time is named.
HOST_HEAVY = 0.5
#: How many such steps are named, the largest device times first.
MOST_NAMED = 5


@dataclass(frozen=True)
class Part:
    """A region, a layer or a step (``what``): its host and device time over all its calls
    (seconds; the host's estimated where only some calls' was read), the calls whose lag was
    read, the sum of their end lags (seconds) and how many ended with the device caught up."""

    name: str
    what: str
    host: float
    device: float
    calls: int
    lag: float
    caught: int
    #: all its calls timed on the device (``calls``: those whose lag was read)
    count: int = 0

    @property
    def share(self) -> float:
        """Host time over device time (0.0 without device time)."""
        return self.host / self.device if self.device > 0 else 0.0

    @property
    def caught_share(self) -> float:
        """The share of the calls that ended with the device caught up."""
        return self.caught / self.calls if self.calls else 0.0

    @property
    def mean_lag(self) -> float:
        """The mean end lag of a call, in seconds: how far the host ran ahead."""
        return self.lag / self.calls if self.calls else 0.0

    @property
    def verdict(self) -> str:
        """``launch-bound``, ``device-bound`` or ``mixed``, by the share of calls caught up."""
        if self.caught_share >= LAUNCH_BOUND:
            return "launch-bound"
        if self.caught_share <= DEVICE_BOUND:
            return "device-bound"
        return "mixed"

    def as_dict(self) -> Dict[str, Any]:
        """Its fields, verdict, share, caught share and mean lag as plain data."""
        out = dataclasses.asdict(self)
        out.update(
            verdict=self.verdict,
            share=self.share,
            caught_share=self.caught_share,
            mean_lag=self.mean_lag,
        )
        return out


def _part(name: str, what: str, rows: Sequence[Any]) -> Part:
    """The part called ``name`` made of ``rows`` (disjoint: none inside another)."""
    return Part(
        name,
        what,
        host=sum(host_estimate(r) for r in rows),
        device=sum(r.total for r in rows),
        calls=sum(r.device_calls for r in rows),
        lag=sum(r.lag for r in rows),
        caught=sum(r.caught for r in rows),
        count=sum(r.count for r in rows),
    )


def _label(row: Any, grouped: bool) -> str:
    """A row's name in the section: its path, marked backward, with its layer (or relation)
    in a summary grouped so."""
    mark = BACKWARD_MARK if row.phase == "backward" else ""
    group = row.scope or row.relation
    return row.name + mark + (f" ({group})" if grouped and group else "")


def _layers(rows: Sequence[Any]) -> List[Part]:
    """Per layer instance (a summary by layer): the outermost rows of its scope, added up."""
    outer: Dict[str, List[Any]] = {}
    last: Dict[int, Any] = {}  # depth -> the latest row there: a row's parent, in tree order
    for r in rows:
        last[r.depth] = r
        parent = last.get(r.depth - 1) if r.depth else None
        if r.scope and r.device_calls and (parent is None or parent.scope != r.scope):
            outer.setdefault(r.scope, []).append(r)
    return [_part(scope, "layer", group) for scope, group in outer.items()]


def parts(summary: Any) -> Dict[str, List[Part]]:
    """``regions`` (the top-level regions with device-timed calls; with none, the top-level
    rows), ``layers`` (a summary by layer only) and ``steps`` (those whose host time is at
    least :data:`HOST_HEAVY` of their device time, the largest device times first, at most
    :data:`MOST_NAMED`)."""
    rows = [r for r in summary.rows if r.device_calls]
    by = getattr(summary, "by", "step")
    by_layer, grouped = by == "layer", by in ("layer", "relation")
    tops = [r for r in rows if r.depth == 0]
    regions = [r for r in tops if r.kind == "region"] or tops
    heavy = [
        _part(_label(r, grouped), "step", [r])
        for r in rows
        if r.kind != "region" and host_estimate(r) >= HOST_HEAVY * r.total
    ]
    heavy.sort(key=lambda p: -p.device)
    return {
        "regions": [_part(_label(r, grouped), r.kind, [r]) for r in regions],
        "layers": _layers(summary.rows) if by_layer else [],
        "steps": heavy[:MOST_NAMED],
    }


def host_device(summary: Any) -> Optional[Dict[str, Any]]:
    """:func:`parts` as plain data (each part :meth:`Part.as_dict`), with the thresholds;
    None where no row has calls timed on the device (a run on the CPU clock)."""
    if not any(r.device_calls for r in summary.rows):
        return None
    out: Dict[str, Any] = {k: [p.as_dict() for p in v] for k, v in parts(summary).items()}
    out["thresholds"] = {
        "launch_bound": LAUNCH_BOUND,
        "device_bound": DEVICE_BOUND,
        "host_heavy": HOST_HEAVY,
    }
    return out


def _time(seconds: float) -> str:
    """A time in the unit it reads best in: ``1.9 ms``."""
    unit, scale = choose_unit([seconds])
    return f"{seconds / scale:.3g} {unit}"


def _sentence(p: Part) -> str:
    """What a part's verdict says, and by how much."""
    read = f"; lags read for {p.calls} of {p.count} calls" if p.calls < p.count else ""
    if p.verdict == "launch-bound":
        return (
            f"launch-bound, the device waited for the host: host {_time(p.host)} of "
            f"{_time(p.device)} device, {100 * p.share:.0f}% ({p.caught} of {p.calls} calls "
            f"caught up{read})"
        )
    if p.verdict == "device-bound":
        return (
            f"device-bound, the host ran ahead of the device: host {_time(p.mean_lag)} ahead "
            f"on average ({p.caught} of {p.calls} calls caught up{read})"
        )
    return (
        f"mixed: {100 * p.caught_share:.0f}% of {p.calls} calls caught up, host "
        f"{_time(p.mean_lag)} ahead on average" + (f" ({read[2:]})" if read else "")
    )


def lines(summary: Any) -> List[str]:
    """The section under the table: a title, a line per region and layer, the steps whose
    host time is most of their device time; none on the CPU clock."""
    if not any(r.device_calls for r in summary.rows):
        return []
    found = parts(summary)
    out = ["Host and device (calls timed with CUDA events; docs/host_device.md):"]
    for p in found["regions"] + found["layers"]:
        what = "layer " if p.what == "layer" else ""
        out.append(f"  {what}{p.name}: {_sentence(p)}")
    if found["steps"]:
        named = ", ".join(f"{p.name} {100 * p.share:.0f}%" for p in found["steps"])
        out.append(f"  host time most of the device time: {named}")
    return out
