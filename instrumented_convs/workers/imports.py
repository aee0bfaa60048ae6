"""Patching a module now if it is imported, else right after its import: one finder, first on
``sys.meta_path`` while any patch waits, runs every patch registered for a module once it is
executed, in the order they were registered. Imports nothing from the package.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Any, Callable, Collection, Dict, List, Optional

__all__ = ["patch_on_import"]

Patch = Callable[[Any], None]
_waiting: Dict[str, List[Patch]] = {}  # module name -> the patches for it, in order
_lock = threading.RLock()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: gives the spec the other finders give, its loader running the
    module's patches once the module is executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        """The spec of ``name`` with the patches waiting for it, or None."""
        if name not in _waiting:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                with _lock:
                    patches = list(_waiting.get(name, ()))
                for patch in patches:
                    patch(module)

        spec.loader = Loader()
        return spec


_finder = _Finder()


def patch_on_import(names: Collection[str], patch: Patch) -> Callable[[], None]:
    """``patch(module)`` for each module of ``names`` imported already, and right after the
    import of each other one; returns what stops the waiting (patches made stay made)."""
    later = []
    for name in names:
        if name in sys.modules:
            patch(sys.modules[name])
        else:
            later.append(name)
    with _lock:
        for name in later:
            _waiting.setdefault(name, []).append(patch)
        if _waiting and _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)

    def stop() -> None:
        with _lock:
            for name in later:
                waiting = _waiting.get(name, [])
                if patch in waiting:
                    waiting.remove(patch)
                if not waiting:
                    _waiting.pop(name, None)
            if not _waiting and _finder in sys.meta_path:
                sys.meta_path.remove(_finder)

    return stop


def waiting() -> Dict[str, int]:
    """How many patches wait for each module (for tests)."""
    with _lock:
        return {k: len(v) for k, v in _waiting.items()}


def finder() -> Optional[importlib.abc.MetaPathFinder]:
    """The finder, while it is on ``sys.meta_path`` (for tests)."""
    return _finder if _finder in sys.meta_path else None
