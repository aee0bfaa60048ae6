"""The eager breakdown of compiled models (``configure(compiled="eager")``): steps do not record
inside compiled code, so the duty cycle's recorded iterations run with
``torch.compiler.set_stance("force_eager")`` and the others compiled. The summary sets an eager
iteration's time beside a compiled one's. Before torch 2.6 (no ``set_stance``) the switch
says so and changes nothing.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any, Dict, List, Optional

import torch

__all__ = ["Eager", "eager", "AVAILABLE"]

logger = logging.getLogger(__name__)

#: Whether this torch can run compiled code eagerly on demand (``set_stance``).
AVAILABLE = hasattr(getattr(torch, "compiler", None), "set_stance")


class Eager:
    """The eager breakdown's state (one instance, :data:`eager`)."""

    def __init__(self) -> None:
        """Off."""
        self.on = False  #: recorded iterations run eagerly
        self.asked = False  #: what ``configure(compiled=...)`` asked, available or not
        self.times: Dict[bool, List[int]] = {True: [], False: []}  #: ns, eager / compiled
        self._forced = False  # the stance is force_eager now, set by us
        self._prior: Optional[str] = None  # the stance before we forced it
        self._last: Optional[bool] = None  # which list ended() appended to last

    def set(self, asked: bool, now: bool) -> None:
        """``configure(compiled="eager" if asked else "compiled")``; ``now``: whether the
        iteration under way is recorded (it runs eagerly from here if so)."""
        self.asked = asked
        if asked and not AVAILABLE:
            logger.warning(
                "instrumented_convs: compiled='eager' needs torch.compiler.set_stance "
                "(torch 2.6 or newer; this is %s): compiled code stays compiled",
                torch.__version__,
            )
        self.on = asked and AVAILABLE
        self.drawn(now)

    def drawn(self, now: bool) -> None:
        """The cycle drew the iteration that begins: recorded (``now``) or not."""
        want = self.on and now
        if want == self._forced:
            return
        if want:
            self._prior = _stance()
            torch.compiler.set_stance("force_eager")
        else:
            torch.compiler.set_stance(self._prior or "default")
        self._forced = want

    def ended(self, i: int, first: int, now: bool, ns: int) -> None:
        """Iteration ``i`` (recorded: ``now``) took ``ns``; the first ``first`` are left out."""
        self._last = None
        if self.on and i >= first:
            self.times[now].append(ns)
            self._last = now

    def take_back(self) -> None:
        """The last iteration did not end after all (the cycle took its boundary back)."""
        if self._last is not None:
            self.times[self._last].pop()
            self._last = None

    def forget(self) -> None:
        """Forget the iteration times (the registry was reset)."""
        self.times = {True: [], False: []}
        self._last = None

    def describe(self) -> Optional[Dict[str, Any]]:
        """What a summary says (None while off and never asked): ``available``, and the
        medians (ms) and counts of eager and compiled iterations."""
        if not self.asked and not any(self.times.values()):
            return None
        out: Dict[str, Any] = {"available": AVAILABLE}
        for now, name in ((True, "eager"), (False, "compiled")):
            t = self.times[now]
            out[name] = {"iterations": len(t), "ms": statistics.median(t) / 1e6 if t else None}
        return out


def _stance() -> str:
    """The compiler's stance now (``default`` where this torch does not say)."""
    try:
        from torch._dynamo import eval_frame

        return str(eval_frame._stance.stance)
    except (ImportError, AttributeError):  # pragma: no cover - another layout
        return "default"


#: The eager breakdown of this process.
eager = Eager()
