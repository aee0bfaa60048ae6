"""Lightning: ``Trainer(profiler=ConvProfiler(dirpath="runs"))`` records the conv layers'
steps of a Lightning run, nested under Lightning's own actions, and leaves the run folder
that ``run`` leaves. Only this module imports Lightning, and nothing imports it.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Collection, Dict, List, Optional, Tuple

import torch

from . import Settings, configure, instrument, region, registry, uninstrument
from .commands.launch import (
    TRACE_LIMIT,
    Hooks,
    listen_on_demand,
    load,
    merge_folder,
    run_meta,
    saved_render_input,
    saved_summary,
    stop_on_demand,
    write_run,
)
from .layers import InstrumentedLayer
from .report import render

__all__ = ["ConvProfiler", "STEP_ACTIONS", "region_of"]

logger = logging.getLogger(__name__)

#: The strategy's hooks that are regions of their own name.
STEP_ACTIONS = ("training_step", "validation_step", "test_step", "predict_step")
TRAINING_BATCH = "training batch"
DATA = "data"
SANITY = " (sanity check)"


def region_of(action: str) -> Optional[str]:
    """The region of a Lightning action's name (None: not one of ours)."""
    if action == "run_training_batch":
        return TRAINING_BATCH
    if action.startswith("[Strategy]"):
        hook = action.rsplit(".", 1)[-1]
        return hook if hook in STEP_ACTIONS else None
    if action.startswith("[_") and action.endswith("_next"):  # [_TrainingEpochLoop].train_..
        return DATA
    return None


def _profiler_bases() -> Tuple[type, ...]:
    """Lightning's ``Profiler`` class of each Lightning package installed."""
    bases = []
    for package in ("lightning.pytorch.profilers", "pytorch_lightning.profilers"):
        try:
            bases.append(importlib.import_module(package).Profiler)
        except ImportError:
            continue
    if not bases:
        raise ImportError(
            "instrumented_convs.lightning needs lightning or pytorch_lightning: "
            "pip install 'instrumented_convs[lightning]'"
        )
    return tuple(bases)


_SWITCHES = tuple(inspect.signature(configure).parameters)
_CYCLE = ("record_every", "budget", "iteration")  # set after the hooks (see setup)


class _Profiler:
    """What :class:`ConvProfiler` adds to Lightning's ``Profiler``.

    :class:`ConvProfiler` is a Lightning ``Profiler`` (of ``lightning`` and of
    ``pytorch_lightning``, whichever are installed: the Trainer checks the type). At each
    ``fit``, ``validate``, ``test`` or ``predict`` call the Trainer sets it up with its
    LightningModule, and for that call:

    - the module's stock PyG and DGL conv layers are instrumented in place, as ``run`` does
      (layers built from our drop-in classes already are); they are put back at the end;
    - ``run``'s hooks are on (:class:`~instrumented_convs.commands.launch.Hooks`): ``forward``
      (``forward (no grad)`` in evaluation) around the outermost module call, ``backward``
      around autograd's, ``optimizer.step`` around the update. Lightning's automatic
      optimization runs ``training_step`` and the backward inside the closure it gives the
      optimizer: the region opens when the closure returns, so it is the update alone;
    - Lightning's actions are regions around them: ``run_training_batch`` is ``training batch``;
      the strategy's ``training_step``, ``validation_step``, ``test_step`` and ``predict_step``
      keep their names; the loops' fetches (``train_dataloader_next``, ``val_next``...) are
      ``data``. The sanity check's are marked: ``validation_step (sanity check)``, ``data
      (sanity check)``.

    When the call ends (the Trainer's ``describe()``), :meth:`ConvProfiler.summary` is the table
    (Lightning logs it, or writes it to ``dirpath/filename`` when a ``filename`` is given) and
    the run folder is written: ``<dirpath>/<stage>/`` (``fit``, ``validate``...; ``fit-2`` for a
    second ``fit`` of the same profiler; ``<filename>-fit`` with a ``filename``), ``dirpath``
    being the Trainer's log directory when none is given, with ``run.json``, ``summary.txt``,
    the page and the timeline as ``run`` leaves them (``python -m instrumented_convs view DIR``
    reads it). Under a strategy of several processes (DDP), every rank records and writes its
    own file and rank 0 merges them (its table is the merged one).

    At the end of each training epoch, the time per call of each step since the last epoch goes
    to TensorBoard (``Summary.to_tensorboard``) through the Trainer's own ``TensorBoardLogger``
    when it has one (``tensorboard=DIR``: a writer of ours there instead; ``False``: nowhere),
    at the Trainer's global step, beside Lightning's own curves.

    The switches of :func:`~instrumented_convs.configure` are arguments (``record_every=10`` or
    ``budget=0.01`` for the duty cycle, ``counters=True``, ``backward_every=1``...), in force
    from set-up to the end of each call, as are ``run``'s ``only``, ``exclude`` and ``warmup``.
    With ``record="on-demand"`` nothing is recorded until ``capture DIR`` (the call's run
    folder) or ``capture PID`` asks for the next N optimizer steps: each capture is a run
    folder in the call's (``capture-1``...), the counters and memory on for it alone.
    """

    def __init__(
        self,
        dirpath: Optional["str | os.PathLike[str]"] = None,
        filename: Optional[str] = None,
        *,
        only: Optional[Collection[str]] = None,
        exclude: Collection[str] = (),
        warmup: int = 0,
        timeline: int = TRACE_LIMIT,
        merge_timeout: float = 60.0,
        tensorboard: "bool | str | os.PathLike[str]" = True,
        **switches: Any,
    ) -> None:
        """``dirpath``/``filename``: Lightning's (where the run folders and the table go);
        ``only``/``exclude``: conv class names to instrument or leave stock; ``warmup``:
        optimizer steps whose records are dropped; ``timeline``: the most calls the run's
        timeline keeps (0: none); ``merge_timeout``: seconds rank 0 waits for the other
        ranks' files; ``tensorboard``: where each training epoch's point goes (the time
        per call of each step since the last one, ``Summary.to_tensorboard``): ``True``, the
        Trainer's own TensorBoard logger if it has one; a folder, a writer of ours there;
        ``False``, nowhere; ``switches``: :func:`~instrumented_convs.configure`'s keywords."""
        super().__init__(dirpath=dirpath, filename=filename)  # type: ignore[call-arg]
        unknown = sorted(set(switches) - set(_SWITCHES))
        if unknown:
            raise TypeError(
                f"ConvProfiler: unknown switches {unknown}; configure takes {_SWITCHES}"
            )
        if isinstance(only, str) or isinstance(exclude, str):
            raise TypeError("only= and exclude= take a collection of class names, not one string")
        _check_own(warmup=warmup, timeline=timeline, merge_timeout=merge_timeout)
        if switches.get("record") == "on-demand" and warmup:
            raise ValueError("ConvProfiler: record='on-demand' records captures only: no warmup")
        if not isinstance(tensorboard, (bool, str, os.PathLike)):
            raise TypeError(
                "ConvProfiler: tensorboard takes True, False or a folder, "
                f"not {type(tensorboard).__name__} {tensorboard!r}"
            )
        try:
            Settings.check(**switches)  # as configure will at set-up, now
        except (TypeError, ValueError) as e:
            raise type(e)(f"ConvProfiler: {e}") from None
        self.only = None if only is None else list(only)
        self.exclude = list(exclude)
        self.warmup = warmup
        self.timeline = timeline
        self.merge_timeout = merge_timeout
        self.switches = switches
        self.tensorboard = tensorboard
        self.folders: List[Path] = []  #: the run folders written, in order
        self._text = ""
        self._calls: Dict[str, int] = {}  # stage -> calls so far
        self._names: Dict[str, Optional[str]] = {}  # action -> region (a cache)
        self._open: Dict[str, List[Any]] = {}
        self._state: Optional[Dict[str, Any]] = None  # while a call is under way

    # -- Lightning's calls -------------------------------------------------------------------
    def setup(
        self, stage: Any, local_rank: Optional[int] = None, log_dir: Optional[str] = None
    ) -> None:
        """The Trainer starts ``stage``: instrument its module, turn the hooks on."""
        super().setup(stage, local_rank, log_dir)  # type: ignore[misc]
        if self._state is not None:  # (a call that never ended: what it recorded is saved)
            self._finish("interrupted")
        module = getattr(self, "_lightning_module", None)
        model = next(module.modules()) if module is not None else None  # (not the proxy)
        converted: List[torch.nn.Module] = []
        if model is not None:
            ours = {id(m) for m in model.modules() if isinstance(m, InstrumentedLayer)}
            instrument(model, only=self.only, exclude=self.exclude)
            converted = [
                m for m in model.modules() if isinstance(m, InstrumentedLayer) and id(m) not in ours
            ]
        demand = self.switches.get("record") == "on-demand"
        later = (*_CYCLE, "record", "counters", "memory") if demand else _CYCLE
        cycle = {k: v for k, v in self.switches.items() if k in later}
        plain = {k: v for k, v in self.switches.items() if k not in later}
        registry.reset()
        previous = configure(timeline=self.timeline, **plain)
        hooks = Hooks(self.only, self.exclude, self.warmup, data=False, on_demand=demand)
        hooks.install()
        name = _stage(stage)
        self._calls[name] = n = self._calls.get(name, 0) + 1
        rank, world = self._job()
        if demand:  # its listener in the call's folder, then its hooks after run's
            self._listen(self._folder(name, n), hooks, model, name, (rank, world))
            configure(record="on-demand", iteration=cycle.get("iteration"))
        elif cycle:  # its hooks after run's, as ``run`` orders them
            configure(**cycle)
        if world is not None:  # a file this rank left here before would be merged as this run's
            for stale in self._folder(name, n).glob(f"rank{rank}.*"):
                stale.unlink()
        self._state = dict(
            callback=self._watch_exceptions(),
            stage=name,
            call=n,
            model=model,
            converted=converted,
            previous=previous,
            hooks=hooks,
            started=time.time(),
        )

    def start(self, action_name: str) -> None:
        """Lightning starts ``action_name``: its region opens, if it has one."""
        try:
            name = self._names[action_name]
        except KeyError:
            name = self._names[action_name] = region_of(action_name)
        if name is None or self._state is None:
            return
        if name != TRAINING_BATCH and self._sanity_checking():
            name += SANITY
        step = region(name)
        step.__enter__()
        self._open.setdefault(action_name, []).append(step)

    def stop(self, action_name: str) -> None:
        """Lightning ends ``action_name``: its region closes (an error if one is raised);
        at the end of a training epoch, the TensorBoard point."""
        if action_name == "run_training_epoch" and self._state is not None:
            self._point()
        opened = self._open.get(action_name)
        if opened:
            # (Lightning stops an action in a ``finally``: what it raised is in flight)
            error = sys.exc_info()
            step = opened.pop()
            if isinstance(error[1], StopIteration) and hasattr(step, "discard"):
                step.discard()  # a fetch that ended the epoch: no batch
            else:
                step.__exit__(*error)

    def summary(self) -> str:
        """The table of the last call that ended (merged over the ranks on rank 0); while a
        call is under way, of what it recorded so far."""
        if self._state is not None:
            return str(registry.summary())
        return self._text

    def describe(self) -> None:
        """The call ended: write its run folder, then let Lightning report the table."""
        self._finish("returned")
        super().describe()  # type: ignore[misc]

    def teardown(self, stage: Optional[str]) -> None:
        """Lightning's teardown (also at garbage collection): ends a call under way."""
        if getattr(self, "_state", None) is not None:
            self._finish("interrupted")
        super().teardown(stage)  # type: ignore[misc]

    # -- the end of a call ---------------------------------------------------------------------
    def _sanity_checking(self) -> bool:
        try:
            return bool(self._lightning_module.trainer.sanity_checking)  # type: ignore[attr-defined]
        except (AttributeError, ReferenceError, RuntimeError):
            return False

    def _watch_exceptions(self) -> Any:
        """A callback on the Trainer that ends the call when it raises (Lightning calls no
        profiler method then): what was recorded is saved, the hooks come off."""
        try:
            trainer = self._lightning_module.trainer  # type: ignore[attr-defined]
        except (AttributeError, ReferenceError, RuntimeError):
            return None
        package = type(trainer).__module__.split(".")[0]
        callbacks = (
            "lightning.pytorch.callbacks" if package == "lightning" else f"{package}.callbacks"
        )
        try:
            base = importlib.import_module(callbacks).Callback
        except ImportError:  # pragma: no cover - a Trainer of neither package
            return None
        profiler = self

        class _EndOnException(base):  # type: ignore[misc, valid-type]
            """Ends the profiler's call when the Trainer raises."""

            def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
                profiler._finish("raised")

        callback = _EndOnException()
        trainer.callbacks.append(callback)
        return trainer, callback

    def _point(self) -> None:
        """The epoch's point on TensorBoard, at the Trainer's global step."""
        state = self._state
        if "writer" not in state:
            state["writer"] = self._writer()
        if state["writer"] is None:
            return
        step = getattr(getattr(self._lightning_module, "trainer", None), "global_step", None)
        registry.summary().to_tensorboard(state["writer"], step=step)

    def _writer(self) -> Any:
        """Where TensorBoard points go (see ``tensorboard``), or None."""
        if self.tensorboard is False:
            return None
        if self.tensorboard is not True:
            from torch.utils.tensorboard import SummaryWriter

            rank, world = self._job()
            folder = Path(self.tensorboard)
            return SummaryWriter(str(folder / f"rank{rank}" if world is not None else folder))
        try:
            loggers = self._lightning_module.trainer.loggers  # type: ignore[attr-defined]
        except (AttributeError, ReferenceError, RuntimeError):
            return None
        for logger_ in loggers:
            if type(logger_).__name__ == "TensorBoardLogger":
                return logger_.experiment  # (rank 0's: a no-op elsewhere, as Lightning's)
        return None

    def _listen(self, folder: Path, hooks: Hooks, model: Any, stage: str, job: Any) -> None:
        """Listen for captures in ``folder``; each says the call it was taken in."""
        started = time.time()
        target = f"{type(model).__name__} ({stage})" if model is not None else stage

        def describe(capture: Dict[str, Any]) -> Dict[str, Any]:
            return run_meta(
                [sys.executable, *sys.argv],
                target,
                sys.argv[1:],
                started,
                "captured",
                hooks,
                lightning={"stage": stage, "call": self._calls[stage]},
            )

        listen_on_demand(
            folder,
            describe,
            job=job,
            timeline=bool(self.timeline),
            counters=bool(self.switches.get("counters")),
            memory=bool(self.switches.get("memory")),
            merge_timeout=self.merge_timeout,
        )

    def _job(self) -> Tuple[Optional[int], Optional[int]]:
        """(rank, world size) of the Trainer's strategy; (None, None) in one process."""
        try:
            trainer = self._lightning_module.trainer  # type: ignore[attr-defined]
            world, rank = int(trainer.world_size), int(trainer.global_rank)
        except (AttributeError, ReferenceError, RuntimeError):
            return None, None
        return (rank, world) if world > 1 else (None, None)

    def _folder(self, stage: str, call: int) -> Path:
        base = Path(self.dirpath or os.getcwd())
        name = f"{self.filename}-{stage}" if self.filename else stage
        return base / (name if call == 1 else f"{name}-{call}")

    def _finish(self, how: str) -> None:
        state, self._state = self._state, None
        if state is None:
            return
        server = None
        if self.switches.get("record") == "on-demand":  # its capture under way written first
            server = stop_on_demand(f"the Trainer's call ended ({how})")
        hooks = state["hooks"]
        if state["callback"] is not None:
            trainer, callback = state["callback"]
            if callback in trainer.callbacks:
                trainer.callbacks.remove(callback)
        try:
            for action in list(self._open):  # regions a raising action left open
                while self._open[action]:
                    step = self._open[action].pop()
                    getattr(step, "discard", lambda: None)()
            hooks.close()
        finally:
            hooks.remove()
        writer = state.get("writer")
        if writer is not None and self.tensorboard not in (True, False):
            writer.close()  # (ours; the Trainer's logger is its own)
        job = self._job()
        model = state["model"]
        target = (
            f"{type(model).__name__} ({state['stage']})" if model is not None else state["stage"]
        )
        meta = run_meta(
            [sys.executable, *sys.argv],
            target,
            sys.argv[1:],
            state["started"],
            how,
            hooks,
            lightning={"stage": state["stage"], "call": state["call"]},
        )
        if server is not None:
            meta["on_demand"] = {"captures": server.captures}
        folder = self._folder(state["stage"], state["call"])
        rank, world = job
        try:
            timeline, name = None, None
            if self.timeline and server is None:
                name = f"rank {rank}" if world is not None else f"{target} ({os.getpid()})"
                timeline = registry.timeline()
            snapshot = [] if server is not None else registry.snapshot()  # (in its captures)
            write_run(folder, snapshot, meta, job=job, timeline=timeline, trace_name=name)
        finally:
            state["previous"].restore()
            for layer in state["converted"]:
                uninstrument(layer)
        self.folders.append(folder)
        if world is None:
            saved = load(folder)
        elif rank == 0:
            saved = merge_folder(folder, wait=self.merge_timeout)
            if saved["ranks_missing"]:
                logger.warning(
                    "ConvProfiler: no file from ranks %s: merged without them",
                    saved["ranks_missing"],
                )
        else:
            self._text = str(registry.summary())
            return
        title = {"title": f"instrumented_convs: {target}"}  # (on demand, its captures under it)
        self._text = render("text", saved_render_input(saved, saved_summary(saved), options=title))
        logger.info("ConvProfiler: saved in %s", folder)


def _check_own(**numbers: Any) -> None:
    """``warmup`` and ``timeline``: whole numbers >= 0; ``merge_timeout``: seconds >= 0."""
    for name, value in numbers.items():
        whole = name != "merge_timeout"
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
            wanted = "a whole number (an int)" if whole else "seconds (a float)"
            raise TypeError(
                f"ConvProfiler: {name} takes {wanted}, not {type(value).__name__} {value!r}"
            )
        if value < 0:
            raise ValueError(f"ConvProfiler: {name} takes a number >= 0, not {value!r}")


def _stage(stage: Any) -> str:
    """``TrainerFn.FITTING`` -> ``fit``."""
    return str(getattr(stage, "value", stage) or "run")


def _make() -> type:
    bases = _profiler_bases()
    doc = (
        "A Lightning profiler that times the conv layers' internal steps, nested under "
        "Lightning's actions: ``Trainer(profiler=ConvProfiler(dirpath=...))``. A subclass of "
        + " and ".join(f"``{b.__module__}.Profiler``" for b in bases)
        + ".\n\n"
        + inspect.cleandoc(_Profiler.__doc__ or "").split("\n", 2)[-1]
    )
    return type("ConvProfiler", (_Profiler, *bases), {"__doc__": doc, "__module__": __name__})


#: The profiler: ``Trainer(profiler=ConvProfiler(dirpath="runs", record_every=10))``.
ConvProfiler: Callable[..., Any] = _make()
