"""The ``data`` region of ``run``: a data loader handing out its next batch.

The ``__next__`` of torch's loader iterators, of PyG's post-sampling iterator (feature
fetching and filtering after sampling) and of DGL's prefetching iterator runs inside one
region on the CPU clock (the host's work the training loop waits for; nested iterators
count once). Modules not imported yet are patched right after their import (a
``sys.meta_path`` finder). The call that ends an iteration (``StopIteration``) records
nothing: the end of an epoch is not a batch.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
from typing import Any, Callable, Collection, List

from ... import core
from ...layers import Step, recording

__all__ = ["LOADERS", "install"]

logger = logging.getLogger(__name__)

#: Data loader iterators patched when their module is imported: module -> class names.
LOADERS = {
    "torch.utils.data.dataloader": ("_BaseDataLoaderIter",),
    "torch_geometric.loader.base": ("DataLoaderIterator",),
    "dgl.dataloading.dataloader": ("_PrefetchingIter",),
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Calls ``patch(module)`` right after one of ``names`` is imported."""

    def __init__(self, names: Collection[str], patch: Callable[[Any], None]) -> None:
        self.names, self.patch = set(names), patch

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        """The spec the other finders give, its loader patching the module once executed."""
        if name not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, patch = spec.loader, self.patch

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                patch(module)

        spec.loader = Loader()
        return spec


def _wrap_next(
    cls: type,
    region: Step,
    tls: Any,
    undo: List[Callable[[], None]],
    ended: Callable[[], None],
) -> None:
    orig = vars(cls)["__next__"]

    compiling = core.compiling

    @functools.wraps(orig)
    def __next__(it: Any) -> Any:
        if compiling() or tls.data or not recording():
            return orig(it)
        tls.data = tls.loaded = 1
        region.__enter__()
        try:
            out = orig(it)
        except StopIteration:
            region.discard()  # the end of an epoch is not a batch
            tls.data = 0
            ended()
            raise
        except BaseException:
            region.__exit__(*sys.exc_info())
            raise
        finally:
            tls.data = 0
        region.__exit__(None, None, None)
        return out

    cls.__next__ = __next__  # type: ignore[attr-defined]
    undo.append(lambda: setattr(cls, "__next__", orig))


def install(
    region: Step,
    tls: Any,
    undo: List[Callable[[], None]],
    ended: Callable[[], None] = lambda: None,
) -> importlib.abc.MetaPathFinder:
    """Time every loader's ``__next__`` in ``region`` (``tls.data`` marks being inside one,
    ``tls.loaded`` that one was called);
    ``undo`` gets what puts each back; ``ended`` is called when a loader's pass ends (its
    iterator raised StopIteration). Returns the finder put first on ``sys.meta_path`` for
    the modules imported later (the caller removes it)."""

    def patch(module: Any) -> None:
        for name in LOADERS.get(module.__name__, ()):
            cls = getattr(module, name, None)
            if cls is None or "__next__" not in vars(cls):
                logger.debug("run: no %s.%s.__next__ to time", module.__name__, name)
                continue
            _wrap_next(cls, region, tls, undo, ended)

    for name in LOADERS:
        if name in sys.modules:
            patch(sys.modules[name])
    finder = _PatchOnImport(set(LOADERS) - set(sys.modules), patch)
    sys.meta_path.insert(0, finder)
    return finder
