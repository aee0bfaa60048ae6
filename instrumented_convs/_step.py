"""``step(name)``: one context manager that is a clock, an NVTX range, a profiler label
and a node of the nesting tree.

The start of a step lives on a per-thread stack, never on the step object, so one object
can be entered recursively and from many threads at once. Entering a step:

1. finds its registry entry under the enclosing step (a dict lookup once the path exists);
2. pushes an NVTX range (domain ``instrumented_convs``) if NVTX is on;
3. opens a ``record_function`` label only while a torch profiler is recording;
4. starts the clock last, so the step's own bookkeeping is outside its time: the CPU clock,
   or a CUDA event recorded on the current stream when the step runs on a CUDA device.

Leaving it stops the clock first, then closes the label and the range in ``finally``
blocks, and records the duration (a CUDA pair is queued and resolved later). Exceptions
propagate unchanged and leave both stacks balanced.

With grad enabled and backward timing on, a step also notes the autograd sequence numbers
at its entry and exit, so that its backward can be timed (:mod:`._backward`).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Optional, TypeVar, Union

import torch

from . import _anchor, _backward, _clock, _config, _ranges
from ._clock import device_index as _device_index
from ._clock import device_is_cuda as _device_is_cuda
from ._registry import registry
from ._stack import CPU, CUDA, UNTIMED, Frame, _tls, current_path, depth, open_steps, pop_own

__all__ = [
    "Step", "step", "region", "instrumenting", "current_path", "depth", "open_steps",
    "nvtx_backend", "set_nvtx_backend", "mark_outputs",
]

F = TypeVar("F", bound=Callable[..., Any])

# The NVTX backend; chosen at import, replaceable with set_nvtx_backend().
_nvtx: _ranges.NvtxBackend = _ranges.make_backend()
_nvtx_push, _nvtx_pop = _nvtx.push, _nvtx.pop
_open_rf = _ranges.open_record_function
_prof = _ranges.profiler_state
_record = registry.record  # the registry's narrow write API, bound once
_auto_cuda = _clock.auto_cuda
_record_event = _clock.record_event
_seq = _anchor.seq_nr
_log_exit = _anchor.log_exit
_grad_enabled = torch.is_grad_enabled
mark_outputs = _anchor.mark_outputs
_backward.set_nvtx(_nvtx_push, _nvtx_pop)


_is_compiling = _ranges.compiling_probe()


def instrumenting() -> bool:
    """Whether steps record right now: enabled, and not inside a ``torch.compile`` trace.

    Layers check it once per forward and run the stock code when it is False.
    """
    return _config.enabled and not _is_compiling()


def set_nvtx_backend(name: Optional[str] = None) -> str:
    """Choose the NVTX backend (``nvtx``, ``torch``, ``none``, or ``None`` for the default)."""
    global _nvtx, _nvtx_push, _nvtx_pop
    _nvtx = _ranges.make_backend(name)
    _nvtx_push, _nvtx_pop = _nvtx.push, _nvtx.pop
    _backward.set_nvtx(_nvtx_push, _nvtx_pop)
    return _nvtx.name


def nvtx_backend() -> str:
    """The name of the NVTX backend in use (``nvtx``, ``torch.cuda.nvtx`` or ``none``)."""
    return _nvtx.name


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"a step name is a non-empty string without '/', not {name!r}")


class Step:
    """A named step: use it as ``with step(name):`` or as a decorator ``@step(name)``."""

    __slots__ = ("name", "scope", "cuda", "dev", "kind")

    def __init__(
        self, name: str, scope: Optional[str] = None, device: Any = None, kind: str = "step"
    ) -> None:
        """A step called ``name``; ``scope`` names a layer instance, ``device`` its device."""
        _check_name(name)
        self.name = name
        self.scope = scope
        self.cuda = _device_is_cuda(device)
        self.dev = _device_index(device) if self.cuda else None
        self.kind = kind

    def __enter__(self) -> "Step":
        """Open the step: registry entry, NVTX range, profiler label, then the clock."""
        stack = _tls.stack
        top = stack[-1]
        if top.task is not None and top.task not in _backward.live:  # a backward raised
            _backward.close_stale(stack)
            top = stack[-1]
        name = self.name
        parent = top.entry
        if parent is None:  # the bottom sentinel: a top-level step
            parent = registry.root
            if self.cuda is None:
                cuda, dev = _auto_cuda(), None
            else:
                cuda, dev = self.cuda, self.dev
        else:
            if parent.retired:  # opened before a reset: continue in the new tree
                parent = registry.relocate(parent)
            if self.cuda is None:
                cuda, dev = top.mode != CPU, top.dev
            else:
                cuda, dev = self.cuda, self.dev
        # Children inherit the scope: the common case looks up by name alone.
        key = name if self.scope is None else (name, self.scope)
        entry = parent.children.get(key)
        if entry is None:
            entry = registry.child(parent, name, self.scope, self.kind)
        pushed = False
        rf = None
        try:
            if _config.nvtx:
                _nvtx_push(name)
                pushed = True
            if _config.record_function and _prof._is_profiler_enabled:
                rf = _open_rf(name)
            frame = top.spare  # never on the stack while ``top`` is on top: free to reuse
            if frame is None:
                frame = top.spare = Frame()
            frame.entry = entry
            frame.owner = self
            frame.rf = rf
            frame.pushed = pushed
            frame.dev = dev
            frame.task = frame.outputs = None
            log = top.log
            if self.kind == "region":  # regions have no backward; steps inside them may
                frame.log, frame.anchor, frame.seq0 = log, False, -1
            elif log is not None:  # inside an anchor: log for its walk
                frame.log, frame.anchor, frame.seq0 = log, False, _seq()
            elif _config.backward and _grad_enabled():  # the outermost step: an anchor
                frame.log, frame.anchor, frame.seq0 = [], True, _seq()
            else:
                frame.log, frame.anchor, frame.seq0 = None, False, -1
            if not cuda:
                frame.mode = CPU
                frame.start = _clock.cpu_now()  # clock last
                stack.append(frame)
            else:
                start = None
                if not torch.cuda.is_current_stream_capturing():
                    try:
                        start = _record_event(dev)
                    except RuntimeError:  # e.g. a pending device error: time nothing, fail nothing
                        start = None
                frame.mode = UNTIMED if start is None else CUDA
                frame.start = start
                stack.append(frame)
        except BaseException:
            try:
                if rf is not None:
                    rf.__exit__(None, None, None)
            finally:
                if pushed:
                    _nvtx_pop()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Close the step: stop the clock first, then the label and the range, then record."""
        stack = _tls.stack
        frame = stack[-1]
        if frame.owner is self:  # the usual, nested case
            if frame.mode == CPU:
                t1 = _clock.cpu_now()  # clock first
            stack.pop()
        else:
            t1 = _clock.cpu_now()
            _backward.close_above(stack, self)
            found = pop_own(stack, self)
            if found is None:  # never entered on this thread: nothing to close
                return None
            frame = found
        # Read the frame now: once popped, it may be reused by the next step opened here.
        entry, start, mode, rf, pushed = frame.entry, frame.start, frame.mode, frame.rf, frame.pushed
        end = None
        if mode == CUDA:
            try:
                end = _record_event(frame.dev)
            except RuntimeError:
                mode = UNTIMED
        try:
            if rf is not None:
                rf.__exit__(None, None, None)
        finally:
            if pushed:
                _nvtx_pop()
            if mode == CPU:
                _record(entry, t1 - start, exc_type is not None)
            elif mode == CUDA:
                registry.record_pending(entry, start, end, exc_type is not None)
            else:
                registry.record_untimed(entry, exc_type is not None)
        if frame.seq0 >= 0:
            _log_exit(frame, stack, entry, mode, exc_type is None)

    def __call__(self, fn: F) -> F:
        """Decorate ``fn`` so that each call runs inside this step (switch read per call)."""
        name, scope, kind, cuda, dev = self.name, self.scope, self.kind, self.cuda, self.dev

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not _config.enabled or _is_compiling():
                return fn(*args, **kwargs)
            s = Step.__new__(Step)
            s.name, s.scope, s.cuda, s.dev, s.kind = name, scope, cuda, dev, kind
            with s:
                return mark_outputs(fn(*args, **kwargs))

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        """``Step('name', scope=...)``."""
        return f"{type(self).__name__}({self.name!r}, scope={self.scope!r})"


class _NullStep:
    """What ``step()`` returns while instrumentation is disabled: does nothing."""

    __slots__ = ("name", "scope", "device", "kind")

    def __init__(self, name: str, scope: Optional[str], device: Any, kind: str) -> None:
        """A no-op standing for ``Step(name, ...)``; the name is checked the same way."""
        _check_name(name)
        self.name, self.scope, self.device, self.kind = name, scope, device, kind

    def __enter__(self) -> "_NullStep":
        """Do nothing."""
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Do nothing (exceptions propagate)."""
        return None

    def __call__(self, fn: F) -> F:
        """Decorate ``fn``; the switch is read at each call, so enabling later works."""
        return Step(self.name, self.scope, self.device, self.kind)(fn)


_NULL_CACHE: dict = {}
_STEP_CACHE: dict = {}


def _null(name: str) -> _NullStep:
    null = _NULL_CACHE.get(name)
    if null is None:
        if len(_NULL_CACHE) > 4096:
            _NULL_CACHE.clear()
        null = _NULL_CACHE[name] = _NullStep(name, None, None, "step")
    return null


def step(name: str, *, scope: Optional[str] = None, device: Any = None) -> Union[Step, _NullStep]:
    """A step named ``name``: a context manager and a decorator (see :class:`Step`).

    ``scope`` names the layer instance the step belongs to (children inherit it) and
    ``device`` the device its work runs on (children inherit it; ``None`` at the top level
    means "CUDA events once CUDA is initialised, else the CPU clock"). While disabled, or
    while ``torch.compile`` traces the code, it returns a no-op.
    """
    if not _config.enabled:
        if scope is None and device is None:
            try:  # the disabled fast path: one flag check and one dict lookup
                return _NULL_CACHE[name]
            except KeyError:
                return _null(name)
        return _NullStep(name, scope, device, "step")
    if _is_compiling():
        return contextlib.nullcontext()  # type: ignore[return-value]
    if scope is None and device is None:
        s = _STEP_CACHE.get(name)
        if s is None:
            if len(_STEP_CACHE) > 4096:
                _STEP_CACHE.clear()
            s = _STEP_CACHE[name] = Step(name)
        return s
    return Step(name, scope, device)


def region(name: str, *, device: Any = None) -> Union[Step, _NullStep]:
    """A step meant for user code (an epoch phase such as ``forward`` or ``loss``)."""
    if _is_compiling():
        return contextlib.nullcontext()  # type: ignore[return-value]
    if not _config.enabled:
        return _NullStep(name, None, device, "region")
    return Step(name, None, device, "region")
