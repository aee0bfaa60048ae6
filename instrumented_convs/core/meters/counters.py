"""Counters (``configure(counters=True)``): the FLOPs, bytes and allocations of the ops each
step runs, charged to the innermost step open on the op's thread.

A debugging mode, off by default for its cost. A dispatch mode sees the aten ops; a function
mode sees torch-sparse's and torch-scatter's, whose C++ hides them from dispatch. What is
counted and its limits: docs/roofline.md.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

import torch
from torch.overrides import TorchFunctionMode

from ..frames.stack import Followed, _tls, follow
from ..native import private
from . import formulas

try:  # (private by name; torch's FlopCounterMode is one)
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # pragma: no cover - the counters cannot be on (logged when asked)
    TorchDispatchMode = TorchFunctionMode

__all__ = ["set_on", "is_on", "of", "clear", "mark", "watch", "probe_extensions", "EXTENSIONS"]

#: entry -> [flops, read, written, ops, {op: n}, allocated, cuda calls, cuda left, cuda peak]
_counts: Dict[Any, List[Any]] = {}
#: Ops the counters have seen since the process started, in steps or not (for benchmarks).
seen = 0
_lock = threading.RLock()
_cost = formulas.cost
_tensors = formulas.tensors
#: The namespaces of the custom ops counted where they are called: registered as
#: CompositeImplicitAutograd kernels, their C++ runs before a dispatch mode could see them.
EXTENSIONS = ("torch_sparse", "torch_scatter")
_OP_TYPES = (private.find("_ops.OpOverloadPacket"), private.find("_ops.OpOverload"))


def probe_extensions() -> bool:
    """Whether the extension mode can tell an op's namespace (checked once: native.private)."""
    return private.probe("dispatch", _extensions_canary)


def _extensions_canary() -> Optional[str]:
    """Why the extension mode cannot tell an op's namespace as it relies on, or None."""
    if TorchDispatchMode is TorchFunctionMode:
        return "has no dispatch modes"
    packet = torch.ops.aten.add
    if type(packet) is not _OP_TYPES[0] or type(packet.default) is not _OP_TYPES[1]:
        return f"gives {type(packet).__name__} for torch.ops.aten.add"
    if packet._qualified_op_name != "aten::add":
        return f"names torch.ops.aten.add {packet._qualified_op_name!r}"
    return None


class _Thread(threading.local):
    """Per thread: inside an extension op (its aten ops not counted again)."""

    inside = 0


#: CUDA memory of the step calls open, per thread: [frame, its start, entry, base, last, peak]
_followed = Followed(_lock)
_here = _Thread()


class _Counting(TorchDispatchMode):
    """Charges each aten op to the innermost step open on its thread."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _here.inside:  # inside an extension op: counted where it was called
            return func(*args, **kwargs)
        ns = getattr(func, "namespace", "aten")
        name = func.overloadpacket.__name__
        return _counted(func, args, kwargs, name if ns == "aten" else f"{ns}.{name}")


class _Watching(_Counting):
    """The dispatch mode while memory alone is on (no extension mode: the aten ops inside
    torch-sparse's are seen as any other). It asks torch.compile (2.8+) to compile as
    without it (Dynamo skips frames while a mode that does not is on: the counters' do,
    whose counts are of the eager ops); the compiled code runs under it."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Compile as without this mode (see the class)."""
        return True


class _Extensions(TorchFunctionMode):
    """Counts the calls of torch-sparse's and torch-scatter's ops where they are called, with
    their formulas or by name (the aten ops inside them are not counted again); their C++
    backward is listed by name in the backward step it runs in."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if type(func) not in _OP_TYPES:
            return func(*args, **kwargs)
        packet = func if type(func) is _OP_TYPES[0] else func.overloadpacket
        ns, _, name = packet._qualified_op_name.partition("::")
        if ns not in EXTENSIONS:
            return func(*args, **kwargs)
        _here.inside += 1
        try:
            out = _counted(func, args, kwargs, f"{ns}.{name}")
        finally:
            _here.inside -= 1
        if _counting:
            _mark_backward(out, args, f"{ns}.{name}.backward")
        return out


def _counted(func: Any, args: Any, kwargs: Any, name: str) -> Any:
    """Run op ``name`` and charge it (and, on CUDA, the allocator's bytes around it); with
    memory on, let :mod:`.memory` see it too (its ``before`` and ``after``)."""
    global seen
    seen += 1
    stack = _tls.stack
    entry = stack[-1].entry
    mem = memory_watch
    if entry is None:
        calls = _followed.calls()
        if calls:
            _close_calls(calls, 0)
        if mem is not None:
            mem.outside()
        return func(*args, **kwargs)
    if _cuda:
        before = torch.cuda.memory_allocated()
        follow(_followed.calls(), stack, before, _close_calls)
    if mem is not None:
        mem.before(stack)
    out = func(*args, **kwargs)
    if _cuda:
        after = torch.cuda.memory_allocated()
        for call in _followed.calls():
            call[4] = after
            if after > call[5]:
                call[5] = after
    if mem is not None:
        mem.after(entry, args, kwargs, out)
    if _counting:
        op = name if "." in name else f"aten.{name}"
        _charge(entry, op, _cost(name, args, kwargs, out), _allocated(args, kwargs, out))
    return out


def _allocated(args: Any, kwargs: Any, out: Any) -> int:
    """Bytes of the storages of ``out`` that none of the op's arguments holds."""
    try:
        held = {
            s.data_ptr()
            for t in _tensors(list(args) + list(kwargs.values()))
            for s in formulas.storages(t)
        }
        total = 0
        for t in _tensors(out if isinstance(out, (list, tuple)) else (out,)):
            for s in formulas.storages(t):
                if s.data_ptr() not in held:
                    held.add(s.data_ptr())
                    total += s.nbytes()
        return total
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass)
        return 0


def _mark_backward(out: Any, args: Any, op: str) -> None:
    """List ``op`` (an extension op's C++ backward) in the step its backward runs in."""
    inputs = [t.grad_fn for t in _tensors(args)]
    for t in _tensors(out if isinstance(out, (list, tuple)) else (out,)):
        node = t.grad_fn
        if node is not None and all(node is not n for n in inputs):
            node.register_hook(lambda grad_inputs, grad_outputs: mark(op))
            return


def _close_calls(calls: List[List[Any]], keep: int) -> None:
    """Charge the CUDA memory of ``calls[keep:]`` to their entries and forget them."""
    with _lock:
        for _, _, entry, base, last, peak in calls[keep:]:
            rec = _record(entry)
            rec[6] += 1
            rec[7] += last - base
            rec[8] = max(rec[8], peak - base)
        del calls[keep:]


def _record(entry: Any) -> List[Any]:
    rec = _counts.get(entry)
    if rec is None:
        rec = _counts[entry] = [0, 0, 0, 0, {}, 0, 0, 0, 0]
    return rec


def _charge(entry: Any, op: str, cost: Optional[Any], allocated: int = 0) -> None:
    """One op for ``entry``: its ``cost`` (FLOPs, bytes read, written), or unknown ``op``."""
    with _lock:
        rec = _record(entry)
        rec[3] += 1
        rec[5] += allocated
        if cost is None:
            rec[4][op] = rec[4].get(op, 0) + 1
        else:
            rec[0] += cost[0]
            rec[1] += cost[1]
            rec[2] += cost[2]


_mode: Optional[_Counting] = None
_ext: Optional[_Extensions] = None
_owner: Optional[int] = None
_cuda = False  # whether the CUDA allocator is read around each op (set when turned on)
_counting = False  # whether ops are counted (the modes may be on for memory alone)
#: :mod:`.memory`'s watcher while memory is on (it sees every op in a step), else None.
memory_watch: Optional[Any] = None


def is_on() -> bool:
    """Whether the counters are on."""
    return _counting


def set_on(on: bool) -> None:
    """Turn the counters on (on this thread, and autograd's for its backward) or off (on the
    thread that turned them on; a mode lives on a thread's own stack)."""
    global _counting, _cuda
    if on and not _counting:
        _modes("count")
        _cuda = torch.cuda.is_available()
        _counting = True
    elif not on and _counting:
        _check_owner("counters")
        _counting = False
        _settle()
        _cuda = False
        _modes("watch" if memory_watch is not None else None)


def watch(watcher: Optional[Any]) -> None:
    """Let ``watcher`` (:mod:`.memory`'s) see every op run in a step, through the modes the
    counters use (one pair of modes serves both: a mode stack pops its top, whoever asks),
    or stop (``None``)."""
    global memory_watch
    if watcher is not None:
        _modes("count" if _counting else "watch")
        memory_watch = watcher
    elif memory_watch is not None:
        _check_owner("memory recording")
        memory_watch = None
        if not _counting:
            _modes(None)


def _check_owner(what: str) -> None:
    if _mode is not None and threading.get_ident() != _owner:
        raise RuntimeError(f"{what} is turned off on the thread that turned it on")


def _modes(kind: Optional[str]) -> None:
    """On this thread: the counters' modes (``count``: the dispatch mode and the extension
    mode), memory's alone (``watch``: :class:`_Watching`), or none (``None``); the modes
    on now are left first when they are others (ours are on top of the mode stacks)."""
    global _mode, _ext, _owner
    want = {"count": _Counting, "watch": _Watching, None: None}[kind]
    if want is not None and TorchDispatchMode is TorchFunctionMode:  # (logged once)
        probe_extensions()
        return
    if _mode is not None and type(_mode) is not want:
        (mode, ext), _mode, _ext, _owner = (_mode, _ext), None, None, None
        if ext is not None:
            ext.__exit__(None, None, None)
        mode.__exit__(None, None, None)
    if want is not None and _mode is None:
        counting = kind == "count" and probe_extensions()
        mode, ext = want(), _Extensions() if counting else None
        mode.__enter__()
        if ext is not None:
            ext.__enter__()
        _mode, _ext, _owner = mode, ext, threading.get_ident()


def _settle() -> None:
    """Close every tracked call on every thread. A call closes when the next op on its thread
    finds it closed, or here, at a snapshot: one taken while a step runs on another thread
    splits that call in two."""
    _followed.settle(_close_calls)


def of(entry: Any) -> Optional[Dict[str, Any]]:
    """``entry``'s own counts (``flops``, ``bytes_read``, ``bytes_written``, ``ops``,
    ``unknown``: ``"aten.foo:3;..."``, ``alloc_bytes``; on CUDA ``cuda_calls``, ``cuda_left``,
    ``cuda_peak``, its calls' own, children in), or None when nothing was charged to it.
    On CUDA an op's transient buffers are not seen, and what a call frees after its last op
    (its locals, as it returns) is in its parent's ``cuda_left``."""
    with _lock:
        if _followed.any_open():
            _settle()
        rec = _counts.get(entry)
        if rec is None:
            return None
        unknown = ";".join(f"{k}:{n}" for k, n in sorted(rec[4].items()))
        return dict(
            flops=rec[0],
            bytes_read=rec[1],
            bytes_written=rec[2],
            ops=rec[3],
            unknown=unknown,
            alloc_bytes=rec[5],
            cuda_calls=rec[6],
            cuda_left=rec[7],
            cuda_peak=rec[8],
        )


def mark(op: str, cost: Optional[Any] = None) -> None:
    """Count one call of ``op``, run outside the dispatcher (DGL's fused kernels), for the
    innermost step on this thread: its ``cost`` ``(FLOPs, bytes read, bytes written)``, or
    without one as an unknown op, listed by name, never zero silently."""
    if not _counting:
        return
    entry = _tls.stack[-1].entry
    if entry is not None:
        _charge(entry, op, cost)


def clear() -> None:
    """Forget every count and every tracked call (``registry.reset()``)."""
    with _lock:
        _counts.clear()
    _followed.clear()
