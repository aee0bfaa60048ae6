"""``step(name)``: one context manager that is a clock, an NVTX range, a profiler label
and a node of the nesting tree, the API layers and users time their code with; and
:func:`recording`, the one gate every layer checks per call. :class:`Step` is the general
case of entering and leaving a step; :mod:`.stepbase` has the common one; :class:`Iteration`
the region that is the duty cycle's iteration.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Optional, TypeVar, Union

import torch

from ..backward import anchor, hooks
from ..clocks import choice
from ..clocks import cpu as clock
from ..compiler import dynamo
from ..dutycycle.cycle import cycle
from ..frames import lifecycle, setup
from ..frames import stack as _stack
from ..frames.stack import ASIDE, Frame, current_path, depth, open_steps, pop_own
from ..settings import switches
from ..storage.registry import backward_key, registry
from .stepbase import StepBase

__all__ = [
    "Step",
    "step",
    "region",
    "recording",
    "current_path",
    "depth",
    "open_steps",
    "mark_outputs",
    "relate",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Re-exported: layers and users import it from here with ``step``.
mark_outputs = anchor.mark_outputs
# Bound once: the hot path (benchmarks/instructions.py). Every layer call asks recording(),
# every ``step(name)`` asks too, and Step._enter runs for every CUDA step; a lookup through a
# module costs each of them instructions (through ``torch``, several times more).
_is_compiling = dynamo.compiling
_grad_enabled = torch.is_grad_enabled


def recording() -> bool:
    """Whether steps record right now: enabled, and not inside a ``torch.compile`` trace.

    The one gate: layers and wrappers check it once per call and run the stock code when it
    is False.
    """
    return not _is_compiling() and switches.enabled  # tracing first: no guard on the switch


# Called eagerly inside a compiled call (after a graph break), its frame is not offered to
# Dynamo: the frames Dynamo sees are the ones it would see without us.
dynamo.skip_frame(recording)


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"a step name is a non-empty string without '/', not {name!r}")


class Step(StepBase):
    """A named step: use it as ``with step(name):`` or as a decorator ``@step(name)``.

    Entering a step finds its registry entry under the enclosing step (a dict lookup once the
    path exists) and opens a frame on this thread's stack (``frames.lifecycle``): an NVTX
    range when a tool can see it, a profiler label only while a torch profiler records,
    and the clock last, so the step's own bookkeeping is outside its time: the CPU clock, or
    a CUDA event on the current stream when the step runs on a CUDA device. Leaving it stops
    the clock first, then closes the label and the range in ``finally`` blocks, and records
    the duration (a CUDA pair is queued and read later). Exceptions propagate unchanged and
    leave the stack balanced. With grad enabled and backward timing on, a step also notes
    the autograd sequence numbers at its entry and exit, so that its backward can be timed
    (``backward.anchor``).

    ``__enter__``/``__exit__`` come from :class:`~instrumented_convs.core.steps.stepbase.StepBase`
    (in C when the extension is built): they handle the common case and call :meth:`_enter` /
    :meth:`_exit` for every other.
    """

    __slots__ = ()

    def __init__(
        self, name: str, scope: Optional[str] = None, device: Any = None, kind: str = "step"
    ) -> None:
        """A step called ``name``; ``scope`` names a layer instance, ``device`` its device."""
        _check_name(name)
        self.name = name
        self.scope = scope
        self.cuda = choice.device_is_cuda(device)
        self.dev = choice.device_index(device) if self.cuda else None
        self.kind = kind
        #: The key of this step's entry among its parent's children.
        self.key = name if scope is None else (name, scope)
        self.region = kind == "region"  # regions have no backward; steps inside them may

    def _enter(self, stack: list, top: Frame) -> "Step":
        """The general case of ``__enter__``: top level, CUDA, ranges or labels, a reset."""
        t_in = clock.cpu_now()  # the tool's own time starts (see Frame.own)
        if top.task is not None and top.task not in hooks.live:  # a backward raised
            hooks.close_stale(stack)
            top = stack[-1]
        parent = top.entry
        cuda = self.cuda
        if parent is None:  # the bottom sentinel: a top-level step
            parent = registry.root
            dev = self.dev
            if cuda is None:
                cuda = choice.auto_cuda()
        else:
            if parent.retired:  # opened before a reset: continue in the new tree
                parent = registry.relocate(parent)
            if cuda is None:
                cuda, dev = top.cuda, top.dev
            else:
                dev = self.dev
        # A step run inside a backward (an autograd Function's own backward recomputing its
        # forward, GroupRevRes; activation checkpointing) is a row of the backward pass, under
        # the backward it runs in; its own autograd graph, if any, is not followed.
        phase = parent.phase
        entry = parent.children.get(self.key if phase == "forward" else backward_key(self.key))
        if entry is None:
            entry = registry.child(parent, self.name, self.scope, self.kind, phase)
        frame = top.spare
        if frame is None:
            frame = top.spare = Frame()
        frame.entry = entry
        frame.owner = self
        frame.cuda = cuda
        frame.dev = dev
        log = top.log
        if self.region or phase != "forward":
            frame.log, frame.seq0 = log if phase == "forward" else None, -1
        elif log is not None:  # inside an anchor: log for its walk
            frame.log, frame.anchor, frame.seq0 = log, False, anchor.seq_nr()
        elif switches.backward and _grad_enabled():  # the outermost step: an anchor
            seq = anchor.seq_nr()
            frame.log, frame.anchor, frame.seq0 = anchor.Log(seq, len(stack)), True, seq
        else:
            frame.log, frame.seq0 = None, -1
        frame.task = frame.outputs = None
        lifecycle.open_frame(frame, self.name, cuda, dev)
        stack.append(frame)
        bottom = stack[0]
        bottom.own += frame.start - t_in  # the clock (a CUDA step's host clock) read last
        bottom.opened += 1
        frame.own = bottom.own
        return self

    def _exit(self, stack: list, frame: Frame, t1: int, exc_type: Any) -> None:
        """The general case of ``__exit__``: ranges, labels, CUDA, exceptions, odd nesting."""
        if frame.owner is self:  # the usual, nested case
            stack.pop()
        else:
            hooks.close_above(stack, self)
            found = pop_own(stack, self)
            if found is None:  # never entered on this thread: nothing to close
                return None
            frame = found
        # Once popped, the frame is reused by the next step opened here: nothing in between
        # opens one (closing a label or a range runs no step).
        bottom = stack[0]
        if self.region:  # the tool's per-call time stays in, its one-time work does not
            own = setup.aside_of(frame) if frame.flags & ASIDE else 0
        else:
            own = bottom.own - frame.own
        lifecycle.close_frame(frame, t1, exc_type is not None, None, own)
        if frame.seq0 >= 0:
            anchor.log_exit(frame, stack, exc_type is None)
        bottom.own += clock.cpu_now() - t1  # this exit's own time, to the steps still open
        return None

    def discard(self) -> None:
        """Close this step, entered on this thread, without recording a call: the block
        turned out not to be one (an iterator's ``__next__`` that ended the iteration). Its
        label and NVTX range close; a step not open here is left alone."""
        stack = _stack.thread_stack()
        if stack[-1].owner is self:
            frame: Optional[Frame] = stack.pop()
        else:
            hooks.close_above(stack, self)
            frame = pop_own(stack, self)
        if frame is not None:
            if frame.flags & ASIDE:
                setup.aside_of(frame)
            lifecycle.abandon_frame(frame, False, count=False)

    def __call__(self, fn: F) -> F:
        """Decorate ``fn`` so that each call runs inside this step (switch read per call)."""
        st = self  # reentrant: the state of each call lives on the thread's stack

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not recording():
                return fn(*args, **kwargs)
            with st:
                return mark_outputs(fn(*args, **kwargs))

        return wrapper  # type: ignore[return-value]

    def __reduce__(self) -> Any:
        """Copies and pickles rebuild the step from its name, scope, device and kind."""
        device = (
            None if self.cuda is None else (torch.device("cuda", self.dev) if self.cuda else "cpu")
        )
        return (type(self), (self.name, self.scope, device, self.kind))

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
    if not switches.enabled:
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


class Iteration:
    """A call of the region named as the cycle's iteration (``configure(iteration=NAME)``):
    :func:`~.step.region` returns one. Outermost, it draws an iteration and opens the region
    (``step``) only when it is recorded; nested in one, it is part of that one."""

    __slots__ = ("step", "outer", "opened")

    def __init__(self, step: Any) -> None:
        """The iteration around ``step`` (the region as it would be without the cycle)."""
        self.step = step
        self.outer = self.opened = False

    def __enter__(self) -> "Iteration":
        """Begin the iteration (outermost) and open its region if it is recorded."""
        self.outer = cycle._open is None
        recorded = cycle.enter() if self.outer else cycle.now
        self.opened = recorded and switches.enabled
        if self.opened:
            self.step.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        """Close the region (if opened) and end the iteration (outermost)."""
        try:
            if self.opened:
                self.step.__exit__(*exc)
        finally:
            if self.outer:
                cycle.exit()

    def __call__(self, fn: Any) -> Any:
        """Decorate ``fn``: each call is an iteration (or part of the one under way)."""
        step = self.step

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Iteration(step):
                return fn(*args, **kwargs)

        return wrapper


def region(name: str, *, device: Any = None) -> Union[Step, _NullStep, Iteration]:
    """A step meant for user code (an epoch phase such as ``forward`` or ``loss``); the
    region named as the duty cycle's iteration (``configure(iteration=name)``) is one."""
    if _is_compiling():
        return contextlib.nullcontext()  # type: ignore[return-value]
    if name == cycle.iteration and cycle.on:
        return Iteration(Step(name, None, device, "region"))
    if not switches.enabled:
        return _NullStep(name, None, device, "region")
    return Step(name, None, device, "region")


def relate(scope: str, relation: Optional[str]) -> None:
    """Say that the steps of the layer scope ``scope`` compute ``relation`` (an edge type of a
    heterogeneous model, ``author__writes__paper``); None forgets it. A summary groups by it
    (``by="relation"``) and every row of the scope carries it."""
    registry.relate(scope, relation)
