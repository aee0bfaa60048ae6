"""Memory per step (``configure(memory=True)``): the bytes each step keeps alive for backward
(``saved_bytes``) and how high the bytes alive rise while it runs (``peak_bytes``).

Each storage an op makes inside a step is charged to that step; autograd's saved-tensor
hooks tell which of them backward keeps. The rules and their limits (the user's own hooks,
CPU against CUDA): docs/memory.md.
"""

from __future__ import annotations

import re
import threading
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..clocks import cpu as clock
from ..frames.stack import Followed, _tls, follow
from ..native import private
from . import formulas

__all__ = [
    "set_on",
    "is_on",
    "of",
    "clear",
    "made",
    "level",
    "watcher",
    "set_samples",
    "samples",
    "probe_hooks",
]

#: storage key (its C pointer) -> [bytes, maker entry, saved already]
_live: Dict[int, List[Any]] = {}
#: entry -> [saved bytes, calls measured, peak bytes, calls begun under others' hooks]
_counts: Dict[Any, List[int]] = {}
_lock = threading.RLock()
_alive = 0  # bytes of the noted CPU storages alive: the level on the CPU
_cuda = False  # the level is the CUDA allocator's (set when turned on)
_on = False  # whether memory is recorded
_aside = False  # the user's hooks were set before and cannot be called by ours: not set
_hooks: Optional[Any] = None  # our saved_tensors_hooks context, entered while on
_owner: Optional[int] = None  # the thread that entered it
_outer: Optional[Tuple[Any, Any]] = None  # the user's hooks ours call (set before ours)
#: The innermost saved-tensor hooks set (torch 2.3+; checked when memory is turned on)
_top = private.find("_C._autograd._top_saved_tensors_default_hooks")
_samples: List[Tuple[int, int]] = []  # (CPU ns, level) while the timeline records
_sample_limit = 0
_tensors = formulas.tensors
_storages = formulas.storages
#: The region of the loop's wait for a batch (``run``'s, Lightning's, the loaders'): what
#: is made under it is the data, made by no step.
DATA = "data"


def _maker(entry: Any) -> Any:
    """Who makes what an op run in ``entry`` makes: ``entry``, or nobody under ``data``."""
    root = _tls.stack[1].entry
    return None if root.name == DATA or root.name.startswith(DATA + " (") else entry


#: The step calls whose peak is being measured, per thread: see stack.follow.
_followed = Followed(_lock)


def level() -> int:
    """The bytes alive that peaks are measured against: on CUDA the allocator's
    ``memory_allocated()`` (everything on the device); on the CPU the noted storages alive
    (what ops made inside steps, DGL's kernels' outputs included; not an op's scratch
    buffers, nor what was made outside steps)."""
    return torch.cuda.memory_allocated() if _cuda else _alive


def _freed(key: int) -> None:
    global _alive
    with _lock:
        rec = _live.pop(key, None)
        if rec is not None:
            _alive -= rec[0]


def _note(t: torch.Tensor, entry: Any, held: Any) -> int:
    """Note the storages of ``t`` not in ``held`` (keys) as made by ``entry``: their bytes."""
    global _alive
    added = 0
    for s in _storages(t):
        key = s._cdata
        if key in held or key in _live:
            continue
        n = s.nbytes()
        if not n:
            continue
        held.add(key)
        with _lock:
            _live[key] = [n, entry, False]
            if s.device.type == "cpu":
                _alive += n
        weakref.finalize(s, _freed, key)
        added += n
    return added


class _Watch:
    """What :mod:`.counters`' dispatch mode calls around each op run in a step."""

    @staticmethod
    def outside() -> None:
        """An op outside every step: the calls still tracked here are over."""
        calls = _followed.calls()
        if calls:
            _close(calls, 0)

    @staticmethod
    def before(stack: List[Any]) -> None:
        """Before an op in a step: follow this thread's open calls."""
        calls = _followed.calls()
        n = len(calls)
        follow(calls, stack, level(), _close)
        if len(calls) > n and (_aside or _top is not None):
            top = None if _aside else _top(False)  # type: ignore[misc]
            if _aside or (top is not None and top[0] is not _pack):  # the user's hooks
                with _lock:
                    for call in calls[n:]:
                        _record(call[2])[3] += 1

    @staticmethod
    def after(entry: Any, args: Any, kwargs: Any, out: Any) -> None:
        """After an op in a step: note what it made; raise the open calls' peaks."""
        results = list(_tensors(out if isinstance(out, (list, tuple)) else (out,)))
        if results:
            try:
                held = {
                    s._cdata
                    for t in _tensors(list(args) + list(kwargs.values()))
                    for s in _storages(t)
                }
                maker = _maker(entry)
                for t in results:
                    _note(t, maker, held)
            except (RuntimeError, NotImplementedError):  # a tensor without storage
                pass
        now = level()
        for call in _followed.calls():
            call[4] = now
            if now > call[5]:
                call[5] = now
        if _sample_limit and (not _samples or _samples[-1][1] != now):
            if len(_samples) < _sample_limit:
                _samples.append((clock.cpu_now(), now))


_watch = _Watch()
#: What the counters' dispatch mode calls around each op in a step while memory is on
#: (``configure`` hands it over: :func:`.counters.watch`).
watcher = _watch


def made(out: Any) -> None:
    """Note the tensors of ``out``, made by a kernel the dispatcher cannot see (DGL's), as
    made by the innermost step on this thread (nothing while memory is off)."""
    if not _on:
        return
    entry = _tls.stack[-1].entry
    if entry is None:
        return
    _watch.before(_tls.stack)
    try:
        held: set = set()
        maker = _maker(entry)
        for t in _tensors(out if isinstance(out, (list, tuple)) else (out,)):
            _note(t, maker, held)
    except (RuntimeError, NotImplementedError):
        pass
    _watch.after(entry, (), {}, ())


def _close(calls: List[List[Any]], keep: int) -> None:
    """Charge the peaks of ``calls[keep:]`` to their entries and forget them."""
    with _lock:
        for _, _, entry, base, _, peak in calls[keep:]:
            rec = _record(entry)
            rec[1] += 1
            if peak - base > rec[2]:
                rec[2] = peak - base
        del calls[keep:]


def _record(entry: Any) -> List[int]:
    rec = _counts.get(entry)
    if rec is None:
        rec = _counts[entry] = [0, 0, 0, 0]
    return rec


class _Packed:
    """What our pack hook keeps of a saved tensor: a detached alias (same storage, same
    version counter), the version it had, and what autograd's error would name; or what
    the user's pack hook made of it, with their unpack hook (called even if memory is off
    by the time the backward runs)."""

    __slots__ = ("alias", "version", "fn", "nr", "outer", "unpack")

    def __init__(
        self,
        alias: Any,
        version: int,
        fn: Optional[str],
        nr: int,
        outer: Any = None,
        unpack: Any = None,
    ) -> None:
        self.alias, self.version, self.fn, self.nr = alias, version, fn, nr
        self.outer, self.unpack = outer, unpack


def _pack(t: torch.Tensor) -> Any:
    try:
        for s in _storages(t):
            rec = _live.get(s._cdata)
            if rec is not None and not rec[2]:
                with _lock:
                    rec[2] = True
                    if rec[1] is not None:
                        _record(rec[1])[0] += rec[0]
    except (RuntimeError, NotImplementedError):
        pass
    outer = _outer
    if outer is not None:  # the user's hooks, set before ours: theirs keep it
        return _Packed(None, 0, None, 0, outer[0](t), outer[1])
    fn = t.grad_fn
    try:
        version = t._version
    except RuntimeError:  # an inference tensor: no version counter
        version = -1
    return _Packed(t.detach(), version, None if fn is None else fn.name(), t.output_nr)


def _unpack(p: _Packed) -> Any:
    if p.alias is None:
        return p.unpack(p.outer)
    t = p.alias
    if p.version >= 0 and t._version != p.version:  # autograd's own check, its message
        head, short, hints = _stock_words()
        name = p.fn
        if name is not None and short:
            name = re.sub(r"Backward\d*$", "", name)
        where = f", which is output {p.nr} of {name}," if name is not None else ""
        sizes = "[" + ", ".join(str(n) for n in t.shape) + "]"
        raise RuntimeError(
            f"{head}[{t.type()} {sizes}]{where} is at version {t._version}; expected version "
            f"{p.version} instead.{hints[torch.is_anomaly_enabled()]}"
        )
    return t


_words: Optional[Tuple[str, bool, Tuple[str, str]]] = None
_HEAD = (
    "one of the variables needed for gradient computation has been modified by an inplace "
    "operation: [torch.FloatTensor [1]], which is output 0 of ExpBackward0, is at version 1; "
    "expected version 0 instead. Hint: "
)
#: torch 2.2's words (without, with anomaly detection), where autograd's cannot be learnt
_WORDS_2_2 = (
    _HEAD + "enable anomaly detection to find the operation that failed to compute its "
    "gradient, with torch.autograd.set_detect_anomaly(True).",
    _HEAD + "the backtrace further above shows the operation that failed to compute its "
    "gradient. The variable in question was changed in there or anywhere later. Good luck!",
)


def _stock_words() -> Tuple[str, bool, Tuple[str, str]]:
    """What autograd's error for a saved tensor modified in place says on this torch (its
    words change between releases): the text before the tensor, whether it names the node
    without ``Backward0``, and its hints without and with anomaly detection. Learnt once,
    from autograd itself when memory is first turned on, before our hooks are set (where the
    user's hide autograd's check, the words of torch 2.2 are used)."""
    global _words
    if _words is None:
        hints = []
        head, short = "", False
        for anomaly in (False, True):
            with warnings.catch_warnings(), torch.autograd.set_detect_anomaly(anomaly):
                warnings.simplefilter("ignore")
                a = torch.zeros(1, requires_grad=True)
                b = a.exp()
                with torch.no_grad():
                    b.add_(0)
                try:
                    b.backward()
                    message = ""
                except RuntimeError as e:
                    message = str(e)
            if "expected version 0 instead." not in message:
                message = _WORDS_2_2[anomaly]
            hints.append(message.partition("expected version 0 instead.")[2])
            if not anomaly:
                head = message.partition("[torch.FloatTensor")[0]
                short = "output 0 of Exp," in message
        _words = (head, short, (hints[0], hints[1]))
    return _words


def is_on() -> bool:
    """Whether memory is recorded."""
    return _on


def _hooks_set() -> bool:
    """Whether saved-tensor hooks are set on this thread (before torch 2.4, which cannot say:
    autograd refuses a second pair on a tensor saved under the first)."""
    with torch.enable_grad():
        b = torch.zeros(1, requires_grad=True).exp()
    try:
        b.grad_fn._raw_saved_result.register_hooks(lambda t: t, lambda t: t)
        return False
    except RuntimeError:
        return True


def probe_hooks() -> bool:
    """Whether torch's reader of the saved-tensor hooks set is used (torch 2.3+, its canary
    passed: :mod:`..native.private`); else the hooks are read from autograd's nodes."""
    global _top
    if _top is not None and not private.probe(
        "saved_hooks", lambda: private.saved_hooks_check(_top)
    ):
        _top = None
    return _top is not None


def set_on(on: bool) -> None:
    """Set our saved-tensor hooks on this thread, or take them away (on the thread that set
    them: hooks live on a thread's own stack). The ops are watched by the counters' mode,
    which ``configure`` hands :data:`watcher` to."""
    global _on, _aside, _hooks, _outer, _cuda, _owner
    if on and not _on:
        probe_hooks()
        outer = _top(False) if _top is not None else None
        aside = _top is None and _hooks_set()  # theirs, which ours cannot call
        if outer is None and not aside:
            _stock_words()  # autograd's words, learnt before our hooks hide its check
        if not aside:
            hooks = torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
            hooks.__enter__()
            _hooks = hooks
        _on, _aside, _outer, _cuda = True, aside, outer, torch.cuda.is_available()
        _owner = threading.get_ident()
    elif not on and _on:
        if threading.get_ident() != _owner:
            raise RuntimeError("memory recording is turned off on the thread that turned it on")
        if _hooks is not None and _top is not None and (_top(False) or (None,))[0] is not _pack:
            raise RuntimeError(
                "memory recording is turned off inside a saved_tensors_hooks block opened "
                "after it was turned on (save_on_cpu, checkpoint): turn it off after the block"
            )
        _settle()
        if _hooks is not None:
            hooks, _hooks = _hooks, None
            hooks.__exit__(None, None, None)
        _on, _aside, _outer, _cuda = False, False, None, False


def _settle() -> None:
    """Close every tracked call on every thread (a snapshot closes them)."""
    _followed.settle(_close)


def of(entry: Any) -> Optional[Dict[str, int]]:
    """``entry``'s own figures (``saved_bytes``, ``mem_calls``, ``peak_bytes``,
    ``saved_aside``), or None when memory recorded nothing for it."""
    _followed.settle(_close)  # the calls still tracked are charged first
    rec = _counts.get(entry)
    if rec is None:
        return None
    return dict(saved_bytes=rec[0], mem_calls=rec[1], peak_bytes=rec[2], saved_aside=rec[3])


def set_samples(limit: int) -> None:
    """Keep the level after each op that changes it, up to ``limit`` samples (the
    timeline's limit; ``0``: stop). Turning it on starts empty."""
    global _sample_limit
    if limit and not _sample_limit:
        del _samples[:]
    _sample_limit = max(limit, 0)


def samples() -> List[Tuple[int, int]]:
    """The level over time: ``(CPU ns, bytes)`` pairs (see :func:`set_samples`)."""
    return list(_samples)


def clear() -> None:
    """Forget every figure and every tracked call (``registry.reset()``); the storages alive
    stay noted for the level, with no maker (one made before a reset counts nothing when it
    is saved after it)."""
    del _samples[:]
    with _lock:
        _counts.clear()
        for rec in _live.values():
            rec[1] = None
    _followed.clear()
