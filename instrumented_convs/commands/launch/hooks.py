"""What ``run`` hooks into while a script runs: its conv layers, and its loop's phases, so
that a script nobody changed is profiled. Every hook is process-wide and comes off again
(:class:`Hooks`).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import weakref
from typing import Any, Callable, Collection, Dict, List, Optional, Set

import torch

from ... import configure, core, instrument, name_layers, registry, uninstrument
from ...layers import InstrumentedLayer, Step, mark_outputs, recording
from ...workers import Recorder
from .inputs import note_inputs
from .models import backend_code, models_of, optimized_module, unwrap

__all__ = ["Hooks", "FORWARD", "NO_GRAD", "BACKWARD", "OPTIMIZER", "DATA", "COMPILED"]

logger = logging.getLogger(__name__)

FORWARD = "forward"
NO_GRAD = "forward (no grad)"
BACKWARD = "backward"
OPTIMIZER = "optimizer.step"
DATA = "data"
COMPILED = "compiled"  #: the prefix of a compiled model's or function's step


class _Local(threading.local):
    def __init__(self) -> None:
        self.depth = 0  # inside a module call
        self.backward = 0  # inside torch.autograd.backward
        self.optimizers: List[Any] = []  # (optimizer, region or None) of steps under way


class Hooks:
    """The hooks of one ``run``; :meth:`install` them, run the script, :meth:`remove` them.

    Every hook is process-wide, installed by :meth:`Hooks.install` before the script starts and
    taken off by :meth:`Hooks.remove`:

    - ``torch.nn.Module.__call__`` is wrapped. The outermost module call on a thread (a model's
      forward; nested module calls pass through after one thread-local read; a torchmetrics
      metric's update is no model's forward and opens no region) first instruments its model,
      once (:func:`~instrumented_convs.instrument` in place: the same module objects and
      parameters, so an optimizer built before keeps working; each layer named after its
      attribute path unless it was named already), then runs inside the region ``forward`` with
      grad enabled, or ``forward (no grad)`` without: evaluation apart from training.
    - ``torch.autograd.backward`` (which ``Tensor.backward`` calls) runs inside ``backward``.
    - torch's global optimizer step hooks open and close ``optimizer.step``; a step given a
      closure (Lightning's, LBFGS's) opens it when the closure returns: the closure's forward
      and backward are its siblings, as in a plain loop, and the region is the update.
    - A data loader's ``__next__`` runs inside ``data``, and its worker processes are recorded
      (:class:`instrumented_convs.workers.Recorder`: the waits, the batches, the workers'
      steps).
    - ``warmup=N``: what the first N optimizer steps recorded is dropped (``registry.reset()``).
    - ``on_demand``: a model is instrumented at its first call even while nothing records
      (a capture's first iteration is then as the others), and the loaders' worker
      processes run stock (a capture records the training process).
    - While the timeline records, what each model call and conv layer call is given (shapes,
      graph sizes) is noted for the trace's ``args``, when it changed (:mod:`.inputs`).

    Regions nest like the user's own: a ``region("epoch")`` in the script contains them.
    """

    def __init__(
        self,
        only: Optional[Collection[str]] = None,
        exclude: Collection[str] = (),
        warmup: int = 0,
        inputs: bool = True,
        data: bool = True,
        epoch: Optional[Callable[[], None]] = None,
        on_demand: bool = False,
    ) -> None:
        """``only``/``exclude``: class names to instrument or leave stock (``instrument``'s);
        ``warmup``: optimizer steps whose records are dropped; ``inputs``: note what model
        and conv layer calls are given while the timeline records (read at :meth:`install`);
        ``data``: time the data loaders' ``__next__`` (a caller that knows its loop's
        fetches, as Lightning's profiler does, says no); ``epoch``: called at the end of
        each epoch: of each pass over a data loader, or in a script that uses none, of each
        optimizer step (a full-batch epoch); ``on_demand``: see :class:`Hooks`."""
        self.only = None if only is None else frozenset(only)
        self.exclude = frozenset(exclude)
        self.warmup = warmup
        self.inputs = inputs
        self.data = data
        self.epoch = epoch
        self.on_demand = on_demand
        self.epochs = 0  #: epochs ended (see ``epoch``)
        self.steps = 0  #: optimizer steps taken
        self.built: Set[str] = set()  #: class names of the conv layers seen in models
        #: the stock layers it instrumented (weak references): :meth:`put_back` reverts them
        self.converted: List["weakref.ref[torch.nn.Module]"] = []
        self._seen: Dict[int, Any] = {}  # id -> weak reference of every module adopted
        self._metrics: Set[int] = set()  # ids of the adopted modules that are metrics
        self._tls = _Local()
        self._undo: List[Callable[[], None]] = []
        # Each region twice: on the CPU clock, and with the device of a top-level step (CUDA
        # events once CUDA is initialised); picked per call by torch.cuda.is_initialized(),
        # which is what a top-level step picks by, without its slower general path.
        self._regions = {
            n: (Step(n, None, "cpu", "region"), Step(n, None, None, "region"))
            for n in (FORWARD, NO_GRAD, BACKWARD, OPTIMIZER)
        }
        self._data = Step(DATA, None, "cpu", "region")
        self._compiled: Dict[int, Step] = {}  # id of a compiled model or function -> its step
        #: the loaders' recorder (``data``): the waits, the batches, the workers
        self.recorder: Optional[Recorder] = None
        self._lock = threading.Lock()

    # -- install and remove ------------------------------------------------------------------
    def install(self) -> "Hooks":
        """Put every hook in place (see :class:`Hooks`); returns ``self``."""
        self._wrap_module_call()
        self._wrap_compile()
        core.watch_compiles()  # (graph breaks attributed as Dynamo compiles: not a hook)
        self._wrap_backward()
        self._hook_optimizers()
        if self.data:
            self.recorder = Recorder(
                region=self._data, ended=self._epoch, workers=not self.on_demand
            ).install()
        return self

    def remove(self) -> None:
        """Take every hook off again (layers instrumented stay instrumented)."""
        if self.recorder is not None:
            self.recorder.remove()  # what it recorded stays readable: close() removes it
        while self._undo:
            self._undo.pop()()

    def put_back(self) -> None:
        """Give the stock layers it instrumented their stock class again (the layers users
        built from our classes stay ours)."""
        while self.converted:
            layer = self.converted.pop()()
            if layer is not None:
                uninstrument(layer)

    def close(self) -> None:
        """Close optimizer regions left open by a step that raised (nothing recorded)."""
        pending = self._tls.optimizers
        while pending:
            region = pending.pop()[1]
            if region is not None:
                region.discard()

    # -- models and their forward ----------------------------------------------------------
    def _wrap_module_call(self) -> None:
        cls = torch.nn.Module
        call = cls.__call__
        tls, seen, adopt, metrics = self._tls, self._seen, self._adopt, self._metrics
        forward, no_grad = self._regions[FORWARD], self._regions[NO_GRAD]
        grad, cuda = torch.is_grad_enabled, torch.cuda.is_initialized
        noting, compiling, idle = self.inputs, core.compiling, self.on_demand
        compiled_type, compiled_steps, owner = optimized_module(), self._compiled, core.owner
        graph_module = torch.fx.GraphModule

        def compiled_call(
            module: torch.nn.Module, args: tuple, kwargs: Dict[str, Any], timed: bool = True
        ) -> Any:
            """A call of ``torch.compile(model)``: a step of its own (``compiled NAME``),
            forward and backward, timed from here, the eager code around it (``timed``);
            Dynamo's traces of our layers during the call are noted as its own."""
            step = compiled_steps.get(id(module))
            if step is None:
                name = f"{COMPILED} {type(unwrap(module)).__name__}"
                step = compiled_steps[id(module)] = Step(name, None, None, "step")
            before, owner.name = owner.name, step.name
            try:
                if not timed:
                    return call(module, *args, **kwargs)
                with step:
                    return mark_outputs(call(module, *args, **kwargs))
            finally:
                owner.name = before

        def note_layer(module: InstrumentedLayer, args: tuple, kwargs: Dict[str, Any]) -> None:
            if core.timeline_recording():
                note_inputs((module.scope,), args, kwargs)  # for the trace

        # Inside a compiled call (a conv layer compiled alone, or called after a graph break)
        # its frames are neither compiled nor offered to Dynamo; elsewhere a plain call.
        note_eagerly, inside_compiled = core.run_eagerly(note_layer), core.inside_compiled

        @functools.wraps(call)
        def __call__(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if compiling():  # Dynamo inlines this into a graph: nothing of ours in it
                return call(module, *args, **kwargs)
            backend = isinstance(module, graph_module) and backend_code(module)
            if tls.depth or not recording() or backend:
                if idle and not tls.depth and id(module) not in seen and not backend:
                    adopt(module)  # (on demand: now)
                if noting and isinstance(module, InstrumentedLayer):
                    (note_eagerly if inside_compiled() else note_layer)(module, args, kwargs)
                elif type(module) is compiled_type:  # a compiled model, not recorded now
                    if tls.depth and recording():  # (or inside an eager model: recorded)
                        return compiled_call(module, args, kwargs)
                    return compiled_call(module, args, kwargs, timed=False)
                return call(module, *args, **kwargs)
            if id(module) not in seen:
                adopt(module)
            tls.depth = 1
            try:
                if id(module) in metrics:  # a metric's update (torchmetrics): no model's forward
                    return call(module, *args, **kwargs)
                training = grad()
                if noting and core.timeline_recording():
                    region = ("region", FORWARD if training else NO_GRAD)
                    if isinstance(module, InstrumentedLayer):  # a conv layer called alone
                        note_inputs((region, module.scope), args, kwargs)
                    else:
                        note_inputs((region,), args, kwargs)
                with (forward if training else no_grad)[cuda()]:
                    if type(module) is compiled_type:
                        return compiled_call(module, args, kwargs)
                    return call(module, *args, **kwargs)
            finally:
                tls.depth = 0

        # torch.compile(model) compiles the frame of model.__call__, this one: skipped, Dynamo
        # compiles the frame it calls (Module.__call__'s own), as without run.
        core.skip_frame(__call__)
        cls.__call__ = __call__  # type: ignore[method-assign]
        self._undo.append(lambda: setattr(cls, "__call__", call))

    def _wrap_compile(self) -> None:
        """``torch.compile(fn)`` of a function (a training step): its calls a step of their
        own, ``compiled NAME``, as a compiled model's are (the model: see ``__call__``)."""
        compile_ = getattr(torch, "compile", None)
        if compile_ is None:  # pragma: no cover - a torch without it
            return
        compiled_steps, compiling, owner = self._compiled, core.compiling, core.owner

        @functools.wraps(compile_)
        def wrapped(model: Any = None, **kwargs: Any) -> Any:
            if model is None:  # @torch.compile(mode=...): the decorator
                return lambda fn: wrapped(fn, **kwargs)
            out = compile_(model, **kwargs)
            if isinstance(model, torch.nn.Module) or not callable(out):
                return out  # a model: its calls are timed by __call__
            name = f"{COMPILED} {getattr(model, '__name__', type(model).__name__)}"
            step = Step(name, None, None, "step")
            unseen = [model]  # its models, listed at its first call (see models_of)

            @functools.wraps(out)
            def call(*args: Any, **kw: Any) -> Any:
                if compiling():
                    return out(*args, **kw)
                if unseen:
                    self._list_models_of(unseen.pop(), name)
                before, owner.name = owner.name, step.name
                try:
                    if not recording():
                        return out(*args, **kw)
                    with step:
                        return mark_outputs(out(*args, **kw))
                finally:
                    owner.name = before

            compiled_steps[id(call)] = step
            return call

        torch.compile = wrapped  # type: ignore[assignment]
        self._undo.append(lambda: setattr(torch, "compile", compile_))

    def _adopt(self, model: torch.nn.Module) -> None:
        """Instrument ``model``'s conv layers and name them, once per model; a compiled
        model's only for the eager breakdown (instrumenting changes the classes Dynamo
        traces: its frames and graph breaks), else its conv layers are listed as such. The
        tool's one-time work: out of the user's rows (``core.setup``)."""
        with self._lock, core.setup():
            if type(model) is optimized_module() and configure().compiled != "eager":
                self._list_compiled(model)
                return
            target = unwrap(model)
            ours = {id(m) for m in target.modules() if isinstance(m, InstrumentedLayer)}
            instrument(target, name=False, only=self.only, exclude=self.exclude)
            self.converted.extend(
                weakref.ref(m)
                for m in target.modules()
                if isinstance(m, InstrumentedLayer) and id(m) not in ours
            )
            name_layers(target, keep=True)  # (each by its path, relations too)
            for module in target.modules():
                if isinstance(module, InstrumentedLayer):
                    self.built.add(type(module)._ic_stock.__name__)
                elif type(module).__module__.startswith(("torch_geometric.nn.conv", "dgl.nn")):
                    self.built.add(type(module).__name__)  # left stock by only/exclude
            seen, metrics = self._seen, self._metrics
            for module in model.modules():
                key = id(module)
                seen[key] = weakref.ref(
                    module, lambda _, key=key: (seen.pop(key, None), metrics.discard(key))
                )
                if type(module).__module__.startswith("torchmetrics."):
                    metrics.add(key)

    def _list_models_of(self, fn: Any, name: str) -> None:
        """List the conv layers of the models a compiled function refers to by name (its
        globals, closure and bound ``self``: :func:`.models.models_of`) as its own, ``name``; run
        inside it, Dynamo traces them and ``run`` never sees their calls. Left as they are,
        as a compiled model's (unless the eager breakdown is on: its eager iterations call
        them through ``run``, which instruments them then)."""
        if configure().compiled == "eager":
            return
        with self._lock:
            for model in models_of(fn):
                if id(model) not in self._seen:
                    self._list_compiled(model, name)

    def _list_compiled(self, model: torch.nn.Module, name: Optional[str] = None) -> None:
        """Note the conv layers of a compiled model (or of one a compiled function ``name``
        runs), left as they are (see :meth:`_adopt`)."""
        target = unwrap(model)
        layers = {}
        for path, module in target.named_modules():
            if isinstance(module, InstrumentedLayer):  # ours note themselves when traced
                stock = type(module)._ic_stock.__name__
                self.built.add(stock)
                if path and module.scope.startswith(stock + "#"):  # not named by the user
                    module.scope = path
            elif type(module).__module__.startswith(("torch_geometric.nn.conv", "dgl.nn")):
                self.built.add(type(module).__name__)
                layers[path] = type(module).__name__
        core.listed(name or f"{COMPILED} {type(target).__name__}", layers)
        seen = self._seen
        for module in model.modules():
            key = id(module)
            seen[key] = weakref.ref(module, lambda _, key=key: seen.pop(key, None))

    # -- backward and optimizer steps -------------------------------------------------------
    def _wrap_backward(self) -> None:
        autograd = torch.autograd
        backward = autograd.backward
        tls, regions, cuda = self._tls, self._regions[BACKWARD], torch.cuda.is_initialized
        compiling = core.compiling

        @core.run_eagerly
        def begin() -> Any:  # (Dynamo is offered none of the region's frames)
            tls.backward = 1
            region = regions[cuda()]
            region.__enter__()
            return region

        @core.run_eagerly
        def end(region: Any, exc: Any) -> None:
            tls.backward = 0
            region.__exit__(*exc)

        @functools.wraps(backward)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if compiling() or tls.backward or not recording():
                return backward(*args, **kwargs)
            region = begin()
            try:
                out = backward(*args, **kwargs)
            except BaseException:
                end(region, sys.exc_info())
                raise
            end(region, (None, None, None))
            return out

        # Eager code after a graph break calls it (a compiled training step's backward):
        # Dynamo would compile this frame; skipped, it runs torch's as without run.
        autograd.backward = core.skip_frame(wrapped)  # Tensor.backward looks it up each call
        self._undo.append(lambda: setattr(autograd, "backward", backward))

    def _hook_optimizers(self) -> None:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        tls, regions, cuda = self._tls, self._regions[OPTIMIZER], torch.cuda.is_initialized
        compiling = core.compiling

        @core.skip_frame  # (called by an optimizer inside a compiled call: as pre's)
        def after(closure: Callable[[], Any], entry: List[Any]) -> Any:
            out = closure()
            pending = tls.optimizers
            if entry[1] is None and pending and pending[-1] is entry and recording():
                region = entry[1] = regions[cuda()]  # the update: from here to the step's end
                region.__enter__()
            return out

        def pre(optimizer: Any, args: Any, kwargs: Any) -> Any:
            if compiling():  # a compiled optimizer step: its region is the eager code around
                return None
            pending = tls.optimizers
            for i, (opt, _) in enumerate(pending):
                if opt is optimizer:  # its last step raised: those regions never ended
                    for _, stale in reversed(pending[i:]):
                        if stale is not None:
                            stale.discard()
                    del pending[i:]
                    break
            entry = [optimizer, None]
            if pending or not recording():  # an optimizer stepping another: one region
                pending.append(entry)
                return None
            pending.append(entry)
            # A closure (Lightning's, LBFGS's) runs the forward and backward inside the step,
            # first: the region opens when it returns, so they stay beside the update.
            if "closure" in kwargs:
                closure = kwargs["closure"]
                if closure is not None:
                    return args, {**kwargs, "closure": functools.partial(after, closure, entry)}
            elif len(args) > 1 and callable(args[1]):
                closure = args[1]
                return (args[0], functools.partial(after, closure, entry), *args[2:]), kwargs
            region = entry[1] = regions[cuda()]
            region.__enter__()
            return None

        def post(optimizer: Any, args: Any, kwargs: Any) -> None:
            if compiling():
                return
            pending = tls.optimizers
            if not pending or pending[-1][0] is not optimizer:
                return
            opened = pending.pop()[1]
            if opened is not None:
                opened.__exit__(None, None, None)
            if not pending:
                self._stepped()

        for hook in (pre, post):  # (run eagerly inside a compiled step: not offered to Dynamo)
            core.skip_frame(hook)
        handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        self._undo.append(lambda: [h.remove() for h in handles])

    def _epoch(self) -> None:
        self.epochs += 1
        if self.epoch is not None:
            self.epoch()

    def _stepped(self) -> None:
        self.steps += 1
        if not (self.recorder and self.recorder.loaded):  # full-batch: a step is an epoch
            self._epoch()
        if self.steps == self.warmup:
            registry.reset()
            logger.info("run: %d warm-up steps done, recording from now", self.warmup)

    def unmatched(self) -> Dict[str, List[str]]:
        """``only``/``exclude`` names that matched no conv class built in a model."""
        out = {}
        for flag, names in (("only", self.only or ()), ("exclude", self.exclude)):
            missing = sorted(set(names) - self.built)
            if missing:
                out[flag] = missing
        return out
