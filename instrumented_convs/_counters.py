"""Counters: the FLOPs and bytes of the ops each step runs (``configure(counters=True)``).

Off by default: a debugging mode, with a cost (docs/performance.md). On, a
``TorchDispatchMode`` sees every aten op (and every op of torch-sparse and torch-scatter,
which go through the dispatcher too) run on the thread that turned it on, and on autograd's
threads for its backward (they inherit the mode). Each op is charged to the innermost step
open on its thread, forward or backward: its FLOPs, bytes read and bytes written from the
formulas of :mod:`._formulas`, and one op; an op no formula knows is counted by name
(``aten.foo``), never as zero silently. Ops outside every step are not counted. While the
counters are on, every call's backward is timed (``backward_every=1``), so that each
backward op lands in its own step rather than in whatever encloses an untimed backward.

Storage only: :func:`of` gives an entry's own counts, which the registry's snapshot
carries (``EntryStats.flops``...); summaries add them up the tree (a step's counts include
its children's, as its time does).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

from torch.utils._python_dispatch import TorchDispatchMode

from . import _config, _formulas
from ._stack import _tls

__all__ = ["set_on", "is_on", "of", "clear", "mark", "on_start"]

_counts: Dict[Any, List[Any]] = {}  # entry -> [flops, bytes read, bytes written, ops, {op: n}]
#: Ops the counters have seen since the process started, in steps or not (for benchmarks).
seen = 0
_lock = threading.Lock()
_cost = _formulas.cost


class _Counting(TorchDispatchMode):
    """Charges each op to the innermost step open on its thread."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        global seen
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        seen += 1
        entry = _tls.stack[-1].entry
        if entry is None:
            return out
        name = func.overloadpacket.__name__
        c = _cost(name, args, kwargs, out)
        _charge(entry, f"{getattr(func, 'namespace', 'aten')}.{name}", c)
        return out


def _charge(entry: Any, op: str, cost: Optional[Any]) -> None:
    """One op for ``entry``: its ``cost`` (FLOPs, bytes read, written), or unknown ``op``."""
    with _lock:
        rec = _counts.get(entry)
        if rec is None:
            rec = _counts[entry] = [0, 0, 0, 0, {}]
        rec[3] += 1
        if cost is None:
            rec[4][op] = rec[4].get(op, 0) + 1
        else:
            rec[0] += cost[0]
            rec[1] += cost[1]
            rec[2] += cost[2]


_mode: Optional[_Counting] = None
_owner: Optional[int] = None
#: Called when the counters are turned on (the DGL kernels' marks install themselves).
on_start: List[Any] = []


def is_on() -> bool:
    """Whether the counters are on."""
    return _mode is not None


def set_on(on: bool) -> None:
    """Turn the counters on (on this thread, and autograd's for its backward) or off (on the
    thread that turned them on; a dispatch mode lives on a thread's own stack)."""
    global _mode, _owner
    if on and _mode is None:
        mode = _Counting()
        mode.__enter__()
        _mode, _owner = mode, threading.get_ident()
        for hook in on_start:
            hook()
    elif not on and _mode is not None:
        if threading.get_ident() != _owner:
            raise RuntimeError("counters are turned off on the thread that turned them on")
        mode, _mode, _owner = _mode, None, None
        mode.__exit__(None, None, None)


def of(entry: Any) -> Optional[Dict[str, Any]]:
    """``entry``'s own counts (``flops``, ``bytes_read``, ``bytes_written``, ``ops``,
    ``unknown``: ``"aten.foo:3;..."``), or None when nothing was charged to it."""
    with _lock:
        rec = _counts.get(entry)
        if rec is None:
            return None
        unknown = ";".join(f"{k}:{n}" for k, n in sorted(rec[4].items()))
        return dict(flops=rec[0], bytes_read=rec[1], bytes_written=rec[2], ops=rec[3],
                    unknown=unknown)  # fmt: skip


def mark(op: str, cost: Optional[Any] = None) -> None:
    """Count one call of ``op``, run outside the dispatcher (DGL's fused kernels), for the
    innermost step on this thread: its ``cost`` ``(FLOPs, bytes read, bytes written)``, or
    without one as an unknown op, listed by name, never zero silently."""
    if _mode is None:
        return
    entry = _tls.stack[-1].entry
    if entry is not None:
        _charge(entry, op, cost)


def clear() -> None:
    """Forget every count (``registry.reset()``)."""
    with _lock:
        _counts.clear()


_config.on_switch("counters", set_on)  # configure(counters=...) turns them on and off
