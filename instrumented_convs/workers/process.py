"""What runs inside a data loader's worker process: its batches recorded, frame by frame.

While workers are recorded, torch's ``_worker_loop`` (looked up when a worker starts, fork or
spawn) is :func:`worker_loop`: each task taken opens the region ``batch``, and a frame is
written before the result goes to the queue. torch's loop, seeds, errors and messages are
untouched.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable, Dict, NamedTuple, Optional

from torch.utils.data._utils import worker as torch_worker

from ..core.clocks import cpu as clock
from ..core.configure import configure
from ..core.frames.stack import thread_stack
from ..core.meters import readings
from ..core.native import private
from ..core.steps.step import Step
from ..core.storage import timeline as core_timeline
from . import frames

__all__ = ["Config", "worker_loop", "recordable", "TORCH_LOOP"]

logger = logging.getLogger(__name__)

#: torch's own worker loop (this module is imported before anything of ours replaces it),
#: None where this torch has none.
TORCH_LOOP: Optional[Callable[..., Any]] = getattr(torch_worker, "_worker_loop", None)
_SIGNATURE = inspect.signature(TORCH_LOOP) if TORCH_LOOP is not None else None
#: What :func:`worker_loop` takes from torch's loop's arguments.
_USED = ("worker_id", "index_queue", "data_queue")


def recordable() -> bool:
    """Whether workers can be recorded: torch's loop is there, with the arguments
    :func:`worker_loop` wraps (checked once, logged where not: core.native.private)."""

    def canary() -> Optional[str]:
        if _SIGNATURE is None:
            return "is missing"
        missing = [name for name in _USED if name not in _SIGNATURE.parameters]
        return f"takes no {', '.join(missing)}" if missing else None

    return private.probe("worker_loop", canary)


BATCH = "batch"  #: the region of one batch in a worker, task taken to result put


class Config(NamedTuple):
    """What a worker needs to record (plain data: it travels to a spawned worker)."""

    folder: str  #: where the frames go
    rank: Optional[int] = None  #: the torch.distributed rank of the training process
    loader: str = ""  #: which loader (its class and a number, per training process)
    timeline: int = 0  #: the timeline's limit in the worker (0: no timeline)
    nvtx: str = "none"


class _Batch:
    """The batch a worker is making: ``idx`` and when it began (CPU ns)."""

    __slots__ = ("idx", "t0")

    def __init__(self, idx: int, t0: int) -> None:
        self.idx, self.t0 = idx, t0


class _Log:
    """The worker's records: its region, the batch under way, its frames."""

    def __init__(self, config: Config, worker_id: int, workers: int) -> None:
        self.config = config
        self.writer = frames.Writer(config.folder)
        self.region = Step(BATCH, None, "cpu", "region")
        self.current: Optional[_Batch] = None
        self.made = 0  # batches handed to the training process
        self.failed = 0  # tasks that raised (the training process gets the error)
        self.passes = 0  # passes over the loader (persistent workers resume between them)
        self.calls = 0  # timeline calls sent so far
        self.head: Dict[str, Any] = dict(
            rank=config.rank,
            loader=config.loader,
            worker=worker_id,
            workers=workers,
            pid=os.getpid(),
            ppid=os.getppid(),
        )

    def begin(self, idx: int) -> None:
        self.drop()
        self.region.__enter__()
        # the span is read inside the region: on the timeline it lies within the batch's
        # slice, however long the process waits between the two (a busy machine)
        self.current = _Batch(idx, clock.cpu_now())

    def drop(self) -> None:
        """Forget the task under way: torch's loop skips the tasks it gets after its
        iterable dataset ended (it sends nothing for them)."""
        if self.current is not None:
            self.current = None
            self.region.discard()

    def resumed(self) -> None:
        self.drop()
        self.passes += 1

    def end(self, idx: Any, data: Any) -> None:
        """Close the batch ``idx`` (if it is the one under way) and write its frame: a batch
        made, a task that raised (``failed``: the training process raises its error), or
        the end of an iterable dataset's pass (nothing made: no frame)."""
        batch = self.current
        if batch is None or batch.idx != idx:
            return
        kind = type(data).__name__
        if kind == "_IterableDatasetStopIteration":
            self.drop()
            return
        self.current = None
        t1 = clock.cpu_now()
        self.region.__exit__(None, None, None)
        ok = kind != "ExceptionWrapper"
        if ok:
            self.made += 1
        else:
            self.failed += 1
        self.frame(span=(batch.idx, self.passes, batch.t0, t1, ok))

    def frame(self, span: Optional[tuple] = None) -> None:
        new: list = []
        if self.config.timeline:
            new, self.calls = core_timeline.calls_since(self.calls)
        self.writer.write(
            dict(
                self.head,
                span=span,
                made=self.made,
                failed=self.failed,
                passes=self.passes,
                snapshot=[tuple(e) for e in readings.snapshot()],
                calls=new,
            )
        )


class _Tasks:
    """The worker's index queue: taking a batch's task opens its region."""

    def __init__(self, queue: Any, log: _Log) -> None:
        self._queue, self._log = queue, log

    def get(self, *args: Any, **kwargs: Any) -> Any:
        r = self._queue.get(*args, **kwargs)
        if type(r) is tuple and len(r) == 2 and isinstance(r[0], int):
            self._log.begin(r[0])
        elif r is not None:  # _ResumeIteration: persistent workers start the next pass
            self._log.resumed()
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


class _Results:
    """The worker's data queue: putting a batch's result closes its region, frame first."""

    def __init__(self, queue: Any, log: _Log) -> None:
        self._queue, self._log = queue, log

    def put(self, item: Any, *args: Any, **kwargs: Any) -> Any:
        if type(item) is tuple and len(item) == 2 and self._log.current is not None:
            try:
                self._log.end(item[0], item[1])
            except Exception:  # never the batch's fault: the batch goes on, unrecorded
                logger.exception("instrumented_convs: a loader worker's frame was not written")
        return self._queue.put(item, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


def _start(config: Config) -> None:
    """A worker's records start empty: no step of the training process open, the whole
    worker recorded (no duty cycle, not on demand), the timeline as asked."""
    del thread_stack()[1:]  # a forked worker's copy of the training thread's open steps
    demand = configure().record == "on-demand"  # (a worker records in full: not on demand)
    configure(
        record="all" if demand else None,
        enabled=True,
        record_every=1,
        budget=None,
        iteration=None,
        backward=False,
        counters=False,
        record_function=False,
        timeline=config.timeline,
        nvtx=config.nvtx,
    )
    readings.reset()


def worker_loop(config: Config, setup: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
    """torch's worker loop, its batches recorded: the worker's records started afresh (a
    forked worker inherits the parent's), each task a region ``batch`` whose frame is
    written before the batch is handed over; ``setup()`` is called in the worker before its
    loop (a module's function: it travels by name)."""
    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
        worker_id = bound.arguments["worker_id"]
        workers = bound.arguments.get("num_workers", 0)
        _start(config)
        setup()
        log = _Log(config, worker_id, workers)
        log.frame()  # the worker started: its file says so even if it makes no batch
        bound.arguments["index_queue"] = _Tasks(bound.arguments["index_queue"], log)
        bound.arguments["data_queue"] = _Results(bound.arguments["data_queue"], log)
        args, kwargs = bound.args, bound.kwargs
    except Exception:  # another torch's loop: run it as it is, unrecorded
        logger.exception("instrumented_convs: this loader worker is not recorded")
        return TORCH_LOOP(*args, **kwargs)
    try:
        return TORCH_LOOP(*args, **kwargs)
    finally:
        log.writer.close()
