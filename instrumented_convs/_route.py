"""Routing an upstream module's global function through a wrapper while a block runs.

A detailed layer that falls back to upstream's own forward (the installed release differs
from its copy) still times the parts it can see from outside. A function that upstream's
forward calls through its module's globals (PyG's ``gcn_norm``) is routed for the length of
the call: :meth:`Route.active` puts the route in the module, counted across threads, and
the last block out puts the original back. The route calls ``inside`` only on a thread that
is within a block, so a stock layer running on another thread meanwhile gets the original,
untouched. Nothing here imports from the package.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, List

__all__ = ["Route"]


class Route:
    """``module.name`` routed through ``inside(original, *args, **kwargs)`` within blocks."""

    def __init__(self, module: Any, name: str, inside: Callable[..., Any]) -> None:
        """A route for ``module.name``, inactive until :meth:`active`."""
        self.module, self.name, self.inside = module, name, inside
        self._lock = threading.Lock()
        self._open: List[Any] = []  # [the original, then one None per open block]
        self._tls = threading.local()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """What the module's global is while routed."""
        original = self._open[0] if self._open else getattr(self.module, self.name)
        if getattr(self._tls, "depth", 0):
            return self.inside(original, *args, **kwargs)
        return original(*args, **kwargs)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the global while the block runs (on this thread: through ``inside``)."""
        with self._lock:
            if not self._open:
                self._open.append(getattr(self.module, self.name))
                setattr(self.module, self.name, self)
            self._open.append(None)
        self._tls.depth = getattr(self._tls, "depth", 0) + 1
        try:
            yield
        finally:
            self._tls.depth -= 1
            with self._lock:
                self._open.pop()
                if len(self._open) == 1:
                    setattr(self.module, self.name, self._open.pop())
