"""Patching a module's classes now if it is imported, else right after its import.

Nothing here imports from the package.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any, Callable, Collection, Optional

__all__ = ["patch_on_import"]


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


def patch_on_import(
    names: Collection[str], patch: Callable[[Any], None]
) -> Optional[importlib.abc.MetaPathFinder]:
    """``patch(module)`` for each module of ``names`` imported already, and right after
    the import of the others: the finder put first on ``sys.meta_path`` for them (the
    caller removes it; None when every module is imported)."""
    for name in names:
        if name in sys.modules:
            patch(sys.modules[name])
    later = set(names) - set(sys.modules)
    if not later:
        return None
    finder = _PatchOnImport(later, patch)
    sys.meta_path.insert(0, finder)
    return finder
