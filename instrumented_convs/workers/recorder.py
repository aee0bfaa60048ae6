"""The training process's side of a data loader: its waits, its batches, its workers.

A :class:`Recorder`, installed, records every torch ``DataLoader`` iterated from then on (or
only those given to it): the wait for each batch, the worker processes (torch's worker loop
replaced while they start), and the loaders' own work. :meth:`Recorder.result` reads the
workers' frames back as plain data.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..core.clocks import cpu as clock
from ..core.configure import configure
from ..core.frames.setup import tool_time
from ..core.steps.step import Step, recording
from ..core.storage import timeline as core_timeline
from ..core.storage.entry import EntryStats
from ..core.storage.registry import registry
from . import charge, copies, frames, process, samplers
from .imports import patch_on_import
from .sites import Site, labels, made_at

__all__ = ["Recorder", "LOADERS"]

logger = logging.getLogger(__name__)

#: Loader iterators whose ``__next__`` the training loop calls: module -> class names.
LOADERS = {
    "torch.utils.data.dataloader": ("_BaseDataLoaderIter",),
    "torch_geometric.loader.base": ("DataLoaderIterator",),
    "dgl.dataloading.dataloader": ("_PrefetchingIter",),
}
_INNER = ("iterator", "dataloader_it")  # PyG's and DGL's iterators: the torch iterator inside
_TAG = "_instrumented_convs"  # the attribute of a torch iterator naming its loader's record


class _Loader:
    """What the training process saw of the loaders made at one place (see
    :meth:`Recorder.result`): one loader, or one made anew at each epoch."""

    __slots__ = (
        "label",
        "kind",
        "site",
        "workers",
        "loaders",
        "calls",
        "batches",
        "wait",
        "own",
        "copy",
        "copies",
        "consumed",
        "passes",
        "first",
        "last",
        "span",
        "taken",
        "_pass0",
        "_tool0",
        "_tool1",
        "_generation",
    )

    def __init__(self, label: str, kind: str, site: Site, workers: int) -> None:
        #: its name while the run goes on (the workers' frames say it); the report's is
        #: made at the end, from where every loader was made (:func:`.sites.labels`)
        self.label = label
        self.kind, self.site, self.workers = kind, site, workers
        self.loaders = 0  # loader objects made there (and iterated)
        self.calls = 0  # __next__ calls while recording, the one that ended a pass included
        self.batches = 0  # those that handed over a batch
        self.wait = 0  # ns inside them (but those that ended a pass)
        #: ns of the loader's own steps inside its waits (this process), per step name
        self.own: Dict[str, int] = {}
        self.copy = 0  # ns (host) of its batches' copies to their device, outside the waits
        self.copies = 0  # how many
        self.consumed = 0  # batches handed over (recording or not)
        self.passes = 0  # passes that ran to their end
        self.first: Optional[int] = None  # CPU ns: the first recorded __next__ began
        self.last: Optional[int] = None  # the last one began (a loop asks once more)
        self.span = 0  # ns of the passes ended: each from its first __next__ to its last
        #: (CPU ns, task index) of each worker's batch taken while the timeline records
        self.taken: List[Tuple[int, int]] = []
        self._pass0: Optional[int] = None  # the pass under way began
        self._tool0 = self._tool1 = 0  # tool_time() as it began, and at the last call
        self._generation = registry.generation  # the registry's, when its figures began

    def restart(self, t0: int) -> None:
        """Forget the times (a ``registry.reset()``: a warm-up ended); the batches stay
        counted, and a pass under way goes on from ``t0``."""
        self.calls = self.batches = self.wait = self.copy = self.copies = self.span = 0
        self.passes = 0
        self.own = {}
        self.first = None
        if self._pass0 is not None:
            self._pass0, self._tool0 = t0, tool_time()
        self._generation = registry.generation

    def to_dict(self) -> Dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__ if not k.startswith("_")}
        out["own"] = dict(self.own)
        if self._pass0 is not None and self.last is not None:  # a loop that broke off
            out["span"] += self.last - self._pass0 - (self._tool1 - self._tool0)
        return out


class Recorder:
    """Records data loaders and their worker processes: each batch's wait, the batches
    handed over (whatever the recording switch: a loader started during a warm-up still
    counts), the workers' batches and the loaders' own work."""

    def __init__(
        self,
        folder: "Optional[str | Path]" = None,
        loaders: Optional[List[Any]] = None,
        rank: Optional[int] = None,
        region: Optional[Step] = None,
        ended: Optional[Callable[[], None]] = None,
        workers: bool = True,
    ) -> None:
        """``folder``: where the workers write their frames (default: a new temporary one,
        removed by :meth:`close`); ``loaders``: record these only (default: every loader);
        ``rank``: the torch.distributed rank, said in each worker's record; ``region``: the
        step each batch's wait runs in; ``ended``: called when a loader's pass ends;
        ``workers``: record the worker processes too (else they run stock)."""
        self._own = folder is None
        if folder is None:
            folder = tempfile.mkdtemp(prefix="instrumented_convs-workers-")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        if rank is None and os.environ.get("RANK", "").isdigit():  # torchrun's
            rank = int(os.environ["RANK"])
        self.rank = rank
        self.region = region
        self.ended = ended
        self.workers = workers
        self.loaded = False  #: a loader's ``__next__`` was called while recording
        self._only: Optional["weakref.WeakSet[Any]"] = None
        if loaders is not None:
            self._only = weakref.WeakSet(loaders)
        self._labels: "weakref.WeakKeyDictionary[Any, _Loader]" = weakref.WeakKeyDictionary()
        self._sites: "weakref.WeakKeyDictionary[Any, Site]" = weakref.WeakKeyDictionary()
        self._seen: List[_Loader] = []
        self._by_site: Dict[Tuple[str, Site], _Loader] = {}
        self._undo: List[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._tls = threading.local()

    def add(self, loader: Any, site: Optional[Site] = None) -> None:
        """Record ``loader`` too (a recorder given loaders records those only); ``site``:
        where it was made (``train.py:42``), if its construction was not seen."""
        if self._only is not None:
            self._only.add(loader)
        if site is not None:
            self._note_site(loader, site)

    def _note_site(self, loader: Any, site: Site) -> None:
        try:
            self._sites.setdefault(loader, site)
        except TypeError:  # not weakly referable: where it is first iterated
            pass

    # -- install and remove -----------------------------------------------------------------
    def install(self) -> "Recorder":
        """Wrap the loaders' iterators, their workers' loop and their own work (and, with a
        region, a batch's copy to its device); returns ``self``."""
        self._undo.append(samplers.install())
        if self.region is not None:  # a loop's regions: the batch's copy is one
            self._undo.append(copies.install())
        self._undo.append(patch_on_import(LOADERS, self._patch))
        return self

    def remove(self) -> None:
        """Take the wrappers off (what was recorded stays readable)."""
        while self._undo:
            self._undo.pop()()

    def close(self) -> None:
        """:meth:`remove`, and a temporary folder removed (read :meth:`result` first)."""
        self.remove()
        if self._own:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _patch(self, module: Any) -> None:
        for name in LOADERS.get(module.__name__, ()):
            cls = getattr(module, name, None)
            if cls is None or "__next__" not in vars(cls):
                logger.debug("no %s.%s.__next__ to time", module.__name__, name)
                continue
            self._wrap_next(cls)
        if module.__name__ == "torch.utils.data.dataloader":
            self._wrap_init(module.DataLoader)
            self._wrap_get_iterator(module.DataLoader)
            self._wrap_process_data(module._MultiProcessingDataLoaderIter)

    def _record_of(self, loader: Any) -> Optional[_Loader]:
        """The record of ``loader``: that of the loaders of its class made at its place."""
        if self._only is not None and loader not in self._only:
            return None
        try:
            return self._labels[loader]
        except (KeyError, TypeError):
            pass
        try:
            site = self._sites.get(loader)
        except TypeError:
            site = None
        if site is None:  # made before the recorder: where it is iterated
            site = made_at(sys._getframe(2))
        kind = type(loader).__name__
        with self._lock:
            seen = self._by_site.get((kind, site))
            if seen is None:
                label = f"{kind}#{len(self._seen) + 1}"
                seen = _Loader(label, kind, site, int(loader.num_workers or 0))
                self._by_site[kind, site] = seen
                self._seen.append(seen)
            seen.loaders += 1
            try:
                self._labels[loader] = seen
            except TypeError:  # not weakly referable: known by its iterators only
                pass
        return seen

    def _wrap_init(self, cls: type) -> None:
        """Note where each loader is made (the user's line that built it)."""
        orig = vars(cls)["__init__"]

        @functools.wraps(orig)
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            orig(loader, *args, **kwargs)
            self._note_site(loader, made_at(sys._getframe(1), loader))

        cls.__init__ = __init__  # type: ignore[misc]
        self._undo.append(lambda: setattr(cls, "__init__", orig))

    def _wrap_get_iterator(self, cls: type) -> None:
        orig = vars(cls)["_get_iterator"]
        module = process.torch_worker
        config = process.Config(str(self.folder), self.rank)

        @functools.wraps(orig)
        def _get_iterator(loader: Any) -> Any:
            seen = self._record_of(loader)
            if (
                seen is None
                or not loader.num_workers
                or not self.workers
                or not process.recordable()
            ):
                it = orig(loader)
            else:
                settings = configure()
                bound = functools.partial(
                    process.worker_loop,
                    config._replace(
                        loader=seen.label, timeline=settings.timeline, nvtx=settings.nvtx
                    ),
                    samplers.install,
                )
                before = module._worker_loop
                module._worker_loop = bound
                try:
                    it = orig(loader)
                finally:
                    module._worker_loop = before
            if seen is not None:
                try:
                    setattr(it, _TAG, seen)
                except AttributeError:
                    pass
            return it

        cls._get_iterator = _get_iterator  # type: ignore[attr-defined]
        self._undo.append(lambda: setattr(cls, "_get_iterator", orig))

    def _wrap_next(self, cls: type) -> None:
        orig = vars(cls)["__next__"]
        now, tls, region = clock.cpu_now, self._tls, self.region

        @functools.wraps(orig)
        def __next__(it: Any) -> Any:
            seen = _record(it)
            if seen is None or getattr(tls, "inside", False):
                return orig(it)  # not ours, or an iterator inside the outer one
            try:
                tls.inside = True
                if not recording():
                    out = orig(it)
                else:
                    out = timed(it, seen)
            finally:
                tls.inside = False
            if not seen.workers:  # a worker's batch is counted as torch takes it
                seen.consumed += 1
            return out

        def timed(it: Any, seen: _Loader) -> Any:
            # The wait is read inside the region: the waits add up to the ``data`` rows. A
            # signal's handler may raise at any line here (torch's, once a worker was killed):
            # whatever raises, the region is closed (``__exit__`` leaves a step that is not
            # open alone) and the loader no longer waited for.
            self.loaded = True
            before: Any = _UNSAID
            try:
                before = charge.waiting(seen)  # its steps and copies meanwhile: its own work
                if region is not None:
                    region.__enter__()
                t0 = now()
                try:
                    out = orig(it)
                except StopIteration:
                    t1 = now()
                    charge.waiting(before)
                    if region is not None:
                        region.discard()  # the end of an epoch is not a batch
                    seen.passes += 1
                    _waited(seen, t0, t1, ended=True)
                    if self.ended is not None:
                        tls.inside = False
                        self.ended()
                    raise
                except BaseException:  # the wait before the error: a call of ``data`` too
                    _waited(seen, t0, now())
                    raise
                t1 = now()
                charge.waiting(before)
                if region is not None:
                    region.__exit__(None, None, None)
                _waited(seen, t0, t1)
                charge.handed(seen)  # the copies that follow are of its batch
                return out
            except BaseException as exc:
                # the handler may raise again in here (torch's, as each other worker ends):
                # both steps are idempotent, so they are retried until they ran through
                for _ in range(_RETRIES):
                    try:
                        if region is not None:
                            region.__exit__(type(exc), exc, exc.__traceback__)
                        if before is not _UNSAID:
                            charge.waiting(before)
                        break
                    except BaseException:  # noqa: BLE001 - the first error is the one raised
                        continue
                raise

        cls.__next__ = __next__  # type: ignore[attr-defined]
        self._undo.append(lambda: setattr(cls, "__next__", orig))

    def _wrap_process_data(self, cls: type) -> None:
        orig = vars(cls)["_process_data"]
        now = clock.cpu_now

        @functools.wraps(orig)
        def _process_data(it: Any, data: Any, *rest: Any) -> Any:
            out = orig(it, data, *rest)  # a worker's error raises here, as stock
            seen = getattr(it, _TAG, None)
            if seen is not None:
                seen.consumed += 1
                if core_timeline.events is not None and getattr(it, "_in_order", True):
                    # torch counted it already: the task this batch came from
                    seen.taken.append((now(), it._rcvd_idx - 1))
            return out

        cls._process_data = _process_data  # type: ignore[attr-defined]
        self._undo.append(lambda: setattr(cls, "_process_data", orig))

    # -- what was recorded ------------------------------------------------------------------
    def result(self) -> Dict[str, Any]:
        """What was recorded, as plain data: ``loaders`` (per loader the training process
        iterated: ``label``, ``rank``, ``workers``, ``calls``, ``wait``, ``consumed``,
        ``passes``, ``first``, ``last``, ``span``: the time of its passes, each from its
        first ``__next__`` to the one that ended it, or to the last, for a loop that broke
        off; ``taken``: while the timeline records, when each worker's batch was taken and
        its task's index; ns on the CPU clock) and ``workers`` (per worker process, from
        its frames: ``rank``, ``loader``, ``worker``, ``pid``, ``batches`` made,
        ``failed``, ``passes``, ``busy`` ns, ``spans`` per batch ``(idx, pass, t0, t1,
        ok)``, ``snapshot`` (``fields``, ``entries``), ``calls`` (timeline calls))."""
        workers = []
        for path in frames.files(self.folder):
            try:
                got = frames.read(path)
            except OSError as exc:
                logger.warning("instrumented_convs: %s not read: %s", path, exc)
                continue
            if not got:
                continue
            last = got[-1]
            spans = [f["span"] for f in got if f.get("span") is not None]
            workers.append(
                {
                    **{k: last[k] for k in ("rank", "loader", "worker", "workers", "pid")},
                    "batches": last["made"],
                    "failed": last["failed"],
                    "passes": last["passes"] + 1,
                    "busy": sum(s[3] - s[2] for s in spans),
                    "spans": spans,
                    "snapshot": {
                        "fields": list(EntryStats._fields),
                        "entries": [list(e) for e in last["snapshot"]],
                    },
                    "calls": [c for f in got for c in f.get("calls", ())],
                }
            )
        named = dict(
            zip((s.label for s in self._seen), labels([(s.kind, s.site) for s in self._seen]))
        )
        for w in workers:
            w["loader"] = named.get(w["loader"], w["loader"])
        workers.sort(key=lambda w: (w["rank"] or 0, w["loader"], w["worker"], w["pid"]))
        rank = self.rank
        loaders = [
            dict(s.to_dict(), label=named[s.label], site=list(s.site), rank=rank)
            for s in self._seen
        ]
        return {"loaders": loaders, "workers": workers}


_UNSAID = object()  #: no loader said to be waited for yet
#: How often the closing of a wait that raised is retried where it raised again.
_RETRIES = 16


def _record(it: Any) -> Optional[_Loader]:
    """The record of the loader an iterator iterates (its own tag, or its inner torch
    iterator's: PyG's and DGL's iterators wrap one)."""
    seen = getattr(it, _TAG, None)
    if seen is None:
        for name in _INNER:
            seen = getattr(getattr(it, name, None), _TAG, None)
            if seen is not None:
                break
    return seen


def _waited(seen: _Loader, t0: int, t1: int, ended: bool = False) -> None:
    """One recorded ``__next__`` of ``seen``'s loader, from ``t0`` to ``t1``; ``ended``: the
    call that ended a pass. A pass's span leaves out the tool's one-time work in it."""
    if seen._generation != registry.generation:  # a reset since (a warm-up ended)
        seen.restart(t0)
    seen.calls += 1
    tool = tool_time()
    if not ended:  # the call that ends a pass waits for no batch (it may stop the workers)
        seen.wait += t1 - t0
        seen.batches += 1
    if seen.first is None:
        seen.first = t0
    if seen._pass0 is None:
        seen._pass0, seen._tool0 = t0, tool
    seen.last, seen._tool1 = t0, tool
    if ended:  # a pass: from its first batch asked for to the call that ended it
        seen.span += t0 - seen._pass0 - (tool - seen._tool0)
        seen._pass0 = None
