"""One row of a summary: the numbers of one step path (in one layer instance), in seconds.

Summaries hold :class:`Row` objects and their exports write the fields; :func:`value_of`
reads a CSV or DataFrame cell back by the field's annotation. A statistic added without a
field of its own is kept in ``Row.extra``. Imports nothing from the package.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["Row", "FIELDS", "TYPES", "TOOL", "value_of", "host_estimate"]

TOOL = "tool"  #: the kind of the tool's own row: its one-time work, outside the total


@dataclass(frozen=True)
class Row:
    """One step path (in one layer instance when grouped by layer); times in seconds."""

    name: str  #: the step path, ``/``-separated (``forward/GCNConv/gcn_norm``)
    step: str  #: the last component of the path
    depth: int  #: 0 for top-level steps
    scope: Optional[str]  #: the layer instance (``None`` when merged, or outside layers)
    kind: str  #: ``step``, ``region``, ``upstream`` or :data:`TOOL`
    count: int  #: calls (timed, and counted with their time estimated: ``estimated``)
    total: float  #: inclusive time, all calls
    self_time: float  #: total minus the totals of the children
    mean: float  #: total / count
    min: float  #: shortest timed call
    max: float  #: longest timed call
    std: float  #: sample standard deviation of the timed calls
    fraction: float  #: total / grand total
    self_fraction: float  #: self_time / grand total
    errors: int = 0  #: calls that ended with an exception (timed all the same)
    untimed: int = 0  #: calls not timed (CUDA-graph capture, or a partial backward)
    phase: str = "forward"  #: ``forward``, or ``backward`` for the backward of a step
    #: Calls whose time is estimated, not measured (backward sampling, see ``configure``):
    #: included in ``count``; ``total``, ``mean`` and ``self_time`` are estimates then.
    estimated: int = 0
    #: The process's rank, in a row of one rank's part of a merged summary (else ``None``).
    rank: Optional[int] = None
    #: Merged rows only (else ``None``): how many ranks timed calls of this step,
    ranks: Optional[int] = None
    slowest: Optional[float] = None  #: the largest total of one rank,
    slowest_rank: Optional[int] = None  #: the rank with that total (the lowest, on a tie),
    fastest: Optional[float] = None  #: the smallest total of a rank that recorded the step.
    # The counters (configure(counters=True)); like ``total``, a step's include its children's.
    flops: int = 0  #: floating-point operations of its ops, all calls
    bytes_read: int = 0  #: bytes its ops read, all calls
    bytes_written: int = 0  #: bytes its ops wrote, all calls
    ops: int = 0  #: ops it ran, all calls (0: the counters were off)
    unknown: str = ""  #: ops no formula knows, with their counts (``"aten.foo:3;..."``)
    alloc_bytes: int = 0  #: bytes of the tensors its ops allocated, all calls
    #: On CUDA: calls whose memory was read, the allocator's bytes they left allocated (all
    #: calls), and the most bytes allocated above a call's start (the largest of any call).
    cuda_calls: int = 0
    cuda_left: int = 0
    cuda_peak: int = 0
    # Memory (configure(memory=True)): the bytes of the tensors made in it (its children
    # in) that autograd kept for backward, all calls; calls whose peak was measured, and the
    # most bytes alive above a call's start (the largest of any call); calls begun under the
    # user's own saved-tensor hooks, whose saved tensors it could not see.
    saved_bytes: int = 0
    mem_calls: int = 0
    peak_bytes: int = 0
    saved_aside: int = 0
    #: A sampled run (the duty cycle): the calls recorded of a row that ``count``, ``total``
    #: and ``self_time`` scale to the whole run (0: every call was recorded), and the
    #: standard error of ``total`` (0.0 when exact).
    sampled: int = 0
    se: float = 0.0
    #: Calls timed on a device (CUDA events) whose host time and lag were read (each step's
    #: first 32, then one in 8; a backward call where it was timed): their host time (the
    #: CPU's, from the start event's record to the end event's, the tool's own time left out;
    #: ``total`` is the device's; :func:`host_estimate` for all calls), how many, the sum of
    #: their end lags (how far the device was behind the host as each ended) and how many
    #: ended caught up. Host time, calls and lags are scaled like ``total`` in a sampled run
    #: (see docs/host_device.md).
    host: float = 0.0
    device_calls: int = 0
    lag: float = 0.0
    caught: int = 0
    #: The device's busy time in those calls (s): the summed durations of the kernels,
    #: copies and memsets they launched, where a report says (an Nsight Systems report read
    #: back: docs/nsys.md); 0.0 where unknown (the in-process clock times spans only).
    busy: float = 0.0
    #: The relation (edge type) of a heterogeneous model the row's layer computes
    #: (``author__writes__paper``): a row of a summary by relation, or by layer; else None.
    relation: Optional[str] = None
    #: The statistics of :data:`~.stats.STATISTICS` that no field above holds (a statistic
    #: added at run time), by name; read as attributes too (``row.name``). Not in
    #: :data:`FIELDS`: written only by a column that shows one (:mod:`.columns`).
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, hash=False)

    def __getattr__(self, name: str) -> Any:
        """A statistic of ``extra`` by name (only names that are no attribute reach here)."""
        extra = self.__dict__.get("extra")
        if extra and name in extra and not name.startswith("__"):
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def parent(self) -> Optional[str]:
        """The path of the enclosing step, or ``None`` at the top level."""
        return self.name.rsplit("/", 1)[0] if "/" in self.name else None

    @property
    def key(self) -> Tuple[str, str, Optional[str], Optional[str]]:
        """What tells the row apart in its summary: path, phase, scope and relation."""
        return (self.name, self.phase, self.scope, self.relation)

    @property
    def spread(self) -> Optional[float]:
        """Slowest over fastest rank's total (merged rows; ``None`` otherwise)."""
        if self.slowest is None or self.fastest is None:
            return None
        if self.fastest == 0:
            return 1.0 if self.slowest == 0 else float("inf")
        return self.slowest / self.fastest


#: Every field of :class:`Row` but ``extra``, in order: what JSON, CSV and pandas write.
FIELDS: List[str] = [f.name for f in dataclasses.fields(Row) if f.name != "extra"]
#: Each field's type, read from its annotation: (``int``, ``float`` or ``str``, optional).
TYPES: Dict[str, Tuple[type, bool]] = {}
for _f in dataclasses.fields(Row):
    if _f.name == "extra":
        continue
    _t = str(_f.type)
    _optional = _t.startswith("Optional[")
    _base = _t[len("Optional[") : -1] if _optional else _t
    TYPES[_f.name] = ({"int": int, "float": float, "str": str}[_base], _optional)


def value_of(field: str, value: Any) -> Any:
    """A cell of CSV text or a DataFrame as ``field``'s value: an empty cell or NaN is
    ``None`` for an optional field; else converted to the field's type."""
    kind, optional = TYPES[field]
    if optional and (value is None or value == "" or (isinstance(value, float) and value != value)):
        return None
    if kind is str:
        return value
    return kind(float(value)) if kind is int and isinstance(value, float) else kind(value)


def host_estimate(row: Any) -> float:
    """``row``'s host time over all its calls: where only some calls' host time was read, their
    mean times ``count``, as ``total`` estimates the calls it did not time."""
    if 0 < row.device_calls < row.count:
        return row.host * row.count / row.device_calls
    return row.host
