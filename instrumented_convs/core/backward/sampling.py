"""Which calls' backward is timed step by step, and counting the others exactly: the hooks
that time a step's backward cost more than the rest of its instrumentation, so each anchor's
backward is timed for a census and a random sample of its calls (:func:`choose`), and the
other calls are counted (:func:`count`), their time estimated from the sample.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from itertools import count as _counter
from typing import Any, Dict, List, Optional, Tuple

from ..frames.lifecycle import close_ended
from ..frames.stack import Frame, _tls
from ..native import speedups
from ..settings import switches
from ..storage.registry import backward_key, backward_parent, registry

__all__ = [
    "Template",
    "choose",
    "remember",
    "count",
    "counted",
    "Count",
    "CENSUS",
    "SAMPLED",
    "COUNT",
]

logger = logging.getLogger(__name__)

#: What :func:`choose` decides for a call: time it (census), time it (random sample), count it.
CENSUS, SAMPLED, COUNT = 0, 1, 2
#: Shapes remembered per anchor entry; calls of further shapes are all timed.
MAX_SHAPES = 64

_random = random.Random().random
_keys = _counter()


class Template:
    """What the timed calls of one shape found: the steps with a backward, parents first, as
    ``(name, key, scope, kind, parent index)``; and how many calls of the shape were seen."""

    __slots__ = ("records", "calls", "_under")

    def __init__(self, records: Tuple[Tuple[Any, ...], ...]) -> None:
        """A template of ``records``, seen once."""
        self.records = records
        self.calls = 1
        self._under: Dict[Any, List[Any]] = {}

    def entries(self, parent: Any) -> List[Any]:
        """The backward entries of the records when their backward runs under ``parent``."""
        got = self._under.get(parent)
        if got is None:
            if len(self._under) >= 16:
                self._under.clear()
            got = []
            for name, key, scope, kind, p in self.records:
                up = parent if p < 0 else got[p]
                e = up.children.get(backward_key(key))
                if e is None:
                    e = registry.child(up, name, scope, kind, "backward")
                got.append(e)
            self._under[parent] = got
        return got


def choose(entry: Any, shape: Any) -> Tuple[Optional[Template], int]:
    """The template of ``shape`` for the anchor ``entry`` (None: first call), and what to do.

    A *shape* is the same anchor entry, the same number of autograd nodes, the same nested
    steps over the same node ranges. Its first ``backward_every`` calls are timed as they
    are (a census, which keeps short runs exact); then one call in ``backward_every``, drawn
    at random (its own ``random.Random``: the user's ``random`` stream is left alone), is
    timed (the sample); every other call is counted. The summary estimates the time of
    counted calls from the sampled ones (``report.stats.estimated_total``): counts stay exact,
    times of sampled rows are unbiased estimates. ``configure(backward_every=1)`` times every
    call.
    """
    state = entry.sampling
    if state is None:
        state = entry.sampling = {}
    t = state.get(shape)
    if t is None:
        return None, CENSUS
    t.calls += 1
    every = switches.backward_every
    if t.calls <= every:
        return t, CENSUS
    return t, (SAMPLED if _random() * every < 1.0 else COUNT)


def remember(entry: Any, shape: Any, recs: List[Any]) -> None:
    """Keep the template of ``shape`` from the records of a timed call (see walk).

    Under the duty cycle (``core.dutycycle``) each stratum of the registry has entries of
    its own, and so templates of its own; a new one takes the count of the same steps'
    template in another stratum, so the census is taken once for the run, not once per
    stratum.
    """
    state = entry.sampling
    if state is None or len(state) >= MAX_SHAPES:
        return
    index: Dict[int, int] = {}
    out = []
    for r in recs:  # parents first; a hooked record's parent is hooked or dropped (None)
        if not r.hooked:
            continue
        index[id(r)] = len(out)
        out.append(
            (r.name, r.key, r.scope, r.kind, -1 if r.parent is None else index[id(r.parent)])
        )
    template = state[shape] = Template(tuple(out))
    if len(registry.strata) > 1:  # the duty cycle: the census goes on where another stratum's is
        for other in registry.counterparts(entry):
            for t in (other.sampling or {}).values():
                if t.records == template.records:
                    template.calls = max(template.calls, t.calls + 1)


def counted(template: Template, fwd_stack: List[Frame]) -> None:
    """Count one call of each of ``template``'s steps, under the step open when the backward
    runs (the count hook's work; the C extension's :data:`Count` does its common case)."""
    try:
        if not (switches.enabled and switches.backward):
            return None
        stack = _tls.stack
        if stack[-1].task is not None:  # a step's backward autograd ran in part: it ended
            close_ended(stack)
        parent = backward_parent(stack, fwd_stack)
        if parent.retired:
            parent = registry.relocate(parent)
        registry.record_skipped(template.entries(parent))
    except Exception:  # never break the user's backward
        logger.exception("instrumented_convs: counting a backward failed")
    return None


class _Count:
    """The hook that counts a call whose backward is not timed (see the module)."""

    __slots__ = ("template", "fwd_stack")

    def __init__(self, template: Template, fwd_stack: List[Frame]) -> None:
        self.template = template
        self.fwd_stack = fwd_stack

    def __call__(self, grad: Any) -> None:
        counted(self.template, self.fwd_stack)


#: The type of count hooks: the C one when the extension is in use, else :class:`_Count`.
Count: Any = speedups.CountHook if speedups is not None else _Count


def count(tensor: Any, node: Any, template: Template, fwd_stack: List[Frame]) -> None:
    """Count the backward of ``template``'s steps when ``node`` (``tensor.grad_fn``) runs:
    one call for each step that the timed calls of the same shape found a backward for,
    under the step open when that backward runs, as a timed call's rows are.

    The hook goes into the tensor's own hook dictionary, registered on its node once, as
    ``Tensor.register_hook`` does, without a removable handle: it lives as long as the graph.
    """
    if not template.records:
        return
    hooks = tensor._backward_hooks
    if hooks is None:
        tensor._backward_hooks = hooks = OrderedDict()
        node._register_hook_dict(tensor)
    hooks[("instrumented_convs", next(_keys))] = Count(template, fwd_stack)
