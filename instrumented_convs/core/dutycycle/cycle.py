"""The duty cycle (``configure(record_every=K)`` or ``budget=B``): record whole training
iterations, one in K drawn at random, and run the stock code between: a long run costs
little, and its totals estimate the whole.

An iteration ends with the outermost optimizer step, or is a call of a named region; drawn
ones land in a stratum the report weights (docs/cycle.md). On demand (:mod:`.demand`), the
iterations a capture asks for are recorded instead, exactly, and nothing else.
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any, Dict, List, Optional

from ..clocks import cpu as clock
from ..compiler.dynamo import compiling, skip_frame
from ..compiler.eager import eager
from ..frames import stack as _stack
from ..native import private
from ..settings import switches
from ..storage import timeline
from ..storage.registry import Stratum, registry
from .budget import Budget, agree
from .demand import Demand

__all__ = ["FIRST", "SEED", "Cycle", "cycle", "gap", "schedule"]

logger = logging.getLogger(__name__)

#: autograd's node counter: whether anything was computed between two optimizer steps.
#: Without torch's (:mod:`..native.private`), a fresh number each read: always something.
seq_nr = private.sequence_counter() or itertools.count().__next__
_QUICK = object()  # the last boundary took the common path (see Cycle._post)
#: What a boundary saves of the cycle (with the registry's current stratum) to take it back.
_SAVED = ("i", "now", "_t0", "_active0", "stratum", "_in", "_next")

#: Iterations always recorded (in full) before drawing starts: warm-up is seen as it is.
FIRST = 3
#: The seed of the draw, shared by every process (a torch.distributed job draws alike).
SEED = 0x1C_5EED_0F_C0DE
_MASK = (1 << 64) - 1


def _unit(i: int, seed: int = SEED) -> float:
    """A number in (0, 1], a splitmix64 hash of ``seed`` and ``i``."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return ((z >> 11) + 1) * 2.0**-53


def gap(i: int, every: int, seed: int = SEED) -> int:
    """How many iterations after iteration ``i`` the next one recorded at one in ``every``
    comes: geometric (``1 + floor(log u / log(1 - 1/every))``, ``u`` the hash of ``seed``
    and ``i``), so each iteration is recorded with probability 1/every, independently of
    the others, and the cycle draws once per recorded iteration, not once per iteration."""
    if every <= 1:
        return 1
    return 1 + int(math.log(_unit(i, seed)) / math.log1p(-1.0 / every))


def schedule(every: int, n: int, start: int = 0, seed: int = SEED) -> List[int]:
    """The iterations below ``n`` a cycle at one in ``every`` started at iteration ``start``
    records (from 0: the first :data:`FIRST` always)."""
    out = list(range(start, min(FIRST, n)))
    i = max(start, FIRST - 1) if start < FIRST else start
    nxt = i + gap(i, every, seed)
    while nxt < n:
        out.append(nxt)
        nxt += gap(nxt, every, seed)
    return out


class Cycle:
    """The duty cycle of this process (one instance, :data:`cycle`)."""

    def __init__(self) -> None:
        """Off: everything is recorded."""
        self.every = 1  #: one iteration in ``every`` is recorded (1: the cycle is off)
        self.budget: Optional[float] = None  #: the budget K is chosen for, if any
        self.iteration: Optional[str] = None  #: the region that is an iteration, if named
        self.i = 0  #: iterations begun before the current one (its number)
        self.now = True  #: whether the current iteration is recorded
        self.stratum: Optional[Stratum] = None  #: the stratum of the drawn iterations
        #: What the last cycle was (``every``, ``budget``, ``iteration``, ``why``), kept
        #: for the summary after it stops.
        self.last: Optional[Dict[str, Any]] = None
        self._budget: Optional[Budget] = None
        self._kept: Optional[Budget] = None  # the last budget's, kept while stopped
        self._handles: List[Any] = []
        self._stepping: List[Any] = []  # optimizers whose step is under way (outermost first)
        self._t0 = 0  # when the current iteration began (the CPU clock)
        self._own = 0  # ns the cycle's hooks took of the current iteration
        self._active0: tuple = ()  # what tells whether it did anything (see _active)
        self._seq = -1  # the autograd sequence number when the last iteration ended
        self._undo: Optional[tuple] = None  # how to take the last boundary back
        self._in: Stratum = registry.strata[0]  # the stratum the current iteration counts in
        self._open: Any = None  # a named iteration is under way
        self._next = FIRST  # the next iteration (from FIRST on) that is recorded
        self._gen = -1  # registry.generation when ``stratum`` was found (a reset: look again)
        self._first = FIRST  # iterations recorded before drawing starts (0 on demand)
        #: On demand (``configure(record="on-demand")``): the captures asked for.
        self.demand = Demand(self)

    # -- switching on and off ---------------------------------------------------------------
    @property
    def on(self) -> bool:
        """Whether the cycle chooses the iterations recorded (drawn, or on demand)."""
        return self.every > 1 or self.budget is not None or self.demand.on

    def start(
        self,
        every: int = 1,
        budget: Optional[float] = None,
        iteration: Optional[str] = None,
        demand: bool = False,
    ) -> None:
        """Draw iterations at one in ``every`` (or under ``budget``), or record those that
        captures ask for (``demand``), delimited by optimizer steps or by calls of the region
        ``iteration`` (see :func:`~.configure.configure`)."""
        kept = self._budget if self._budget is not None else self._kept
        self.stop()
        if demand:
            self.demand.on, self.demand.named, self._first = True, iteration is not None, 0
        if budget is not None:
            if kept is not None and kept.budget == budget and kept.every:  # resumed: as it was
                self._budget, every = kept, kept.every
            else:
                self._budget = Budget(budget)
                every = 10
        self.every, self.budget, self.iteration = every, budget, iteration
        self._remember()
        self.stratum = None
        self._schedule(self.i)
        if demand and iteration is not None:  # outside its iterations, nothing is recorded
            self._outside()
        if iteration is None:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            self._handles = [
                _first_of(register_optimizer_step_pre_hook(self._pre)),
                register_optimizer_step_post_hook(self._post),
            ]
            self._begin()

    def stop(self) -> None:
        """Record everything again, from now on (what was drawn stays as it was; the
        iteration under way counts if it recorded anything)."""
        for h in self._handles:
            h.remove()
        if self._handles and self.now:
            self._settle()
            s = self._in
            s.iterations, s.recorded, s.open = s.iterations + s.open, s.recorded + s.open, 0
        self._handles = []
        self._stepping = []
        self._undo = None
        if self._budget is not None:  # what it learnt, for a cycle resumed with this budget
            self._budget.every = self.every
            self._kept = self._budget
        if self.demand.on:
            self.demand.stop("on demand was turned off")
            self.demand.on, self._first = False, FIRST
        self.every, self.budget, self._budget = 1, None, None
        self.now = True
        switches.drawn = True
        switches.apply()
        eager.drawn(False)
        registry.use(registry.strata[0], _stack.thread_stack())

    def _remember(self) -> None:
        why = self._budget.why if self._budget is not None else ""
        self.last = {
            "every": self.every,
            "budget": self.budget,
            "iteration": self.iteration,
            "why": why,
        }

    # -- iterations ---------------------------------------------------------------------------
    def _target(self, i: int) -> Stratum:
        if self.demand.on:  # a capture is exact
            self._gen = registry.generation
            return registry.strata[0]
        if i < FIRST:
            return registry.strata[0]
        s = self.stratum
        if s is None or s.every != self.every or self._gen != registry.generation:
            same = [t for t in registry.strata[1:] if t.every == self.every]
            s = self.stratum = same[-1] if same else registry.sampled(self.every)
            self._gen = registry.generation
        return s

    def _schedule(self, i: int) -> None:
        """Draw the next recorded iteration after iteration ``i`` (the first ones apart)."""
        if self.demand.on:
            return self.demand.schedule(i)
        i = max(i, FIRST - 1)
        self._next = i + gap(i, self.every)

    @staticmethod
    def _active() -> tuple:
        """What changes when this thread opens a step or autograd records an op."""
        return (_stack.thread_stack()[0].opened, seq_nr())

    def _begin(self) -> None:
        """Draw the iteration that begins now (number ``self.i``) and record it or not. A
        recorded one counts as soon as it does anything (``Stratum.open``; see
        :meth:`_settle`), an unrecorded one once it ends."""
        i = self.i
        if self.demand.on:  # (its first iteration resets the registry: the target after)
            now = self.demand.begins(i)
            target = self._in = self._target(i)
        else:
            target = self._in = self._target(i)
            now = i < FIRST or i >= self._next
            if now and i >= FIRST:
                self._schedule(i)
        self.now = now
        switches.drawn = now
        switches.apply()
        eager.drawn(now)
        if now:
            target.open = 1
            registry.use(target, _stack.thread_stack())
            self._active0 = self._active()
        self._own = 0
        self._t0 = clock.cpu_now()

    def did_something(self) -> bool:
        """Whether the recorded iteration under way opened a step or made an autograd op."""
        return self.now and self._active() != self._active0

    def _settle(self) -> None:
        """Whether the recorded iteration under way counts yet: once it did anything (a
        step, an autograd op), not while empty (the end of a loop, after its last step)."""
        if self.now:
            if self._in not in registry.strata:  # the registry was reset meanwhile
                self._in = self._target(self.i)
            self._in.open = 0 if self._active() == self._active0 else 1

    def _end(self) -> None:
        """The current iteration ends: count it, learn from its time, choose K."""
        t1 = clock.cpu_now()
        i, now, s = self.i, self.now, self._in
        if i < 0:  # the end of the step the registry was reset in: iteration 0 begins
            self.i = 0
            return
        if self._gen != registry.generation and i >= FIRST or s not in registry.strata:
            s = self._in = self._target(i)  # the registry was reset meanwhile: count it there
        s.open = 0
        s.iterations += 1
        eager.ended(i, self._first, now, t1 - self._t0)
        if now:
            s.recorded += 1
            if timeline.events is not None:
                timeline.iteration(i, self.every if i >= FIRST else 1, self._t0, t1)
        b = self._budget
        if b is not None and i >= FIRST:
            b.add(now, t1 - self._t0)
            b.own.append(self._own)
            if now and b.ready(i):
                self._choose(b, i)
        self.i = i + 1

    def _choose(self, b: Budget, i: int) -> None:
        proposed = b.propose()
        every = agree(min(max(proposed, self.every // 2, 1), self.every * 2))  # a step at most
        if every != proposed:
            b.why += f" (one in {every} for now: K moves by half or double at most)"
        b.decided_at = i
        if every != self.every and self.every * 0.8 <= every <= self.every * 1.25:
            b.why += f" (one in {self.every} kept: within a quarter of it)"
        elif every != self.every:
            logger.info("instrumented_convs: recording one iteration in %d (%s)", every, b.why)
            self.every = every
            self._schedule(i)
        self._remember()

    # -- optimizer steps --------------------------------------------------------------------
    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if compiling():  # a compiled optimizer step: nothing of ours in its graph
            return
        stepping = self._stepping
        if stepping:  # an optimizer stepping another, or one whose last step raised
            return self._pre_nested(optimizer)
        stepping.append(optimizer)
        undo = self._undo
        if undo is None:
            return
        self._undo = None
        if self._budget is not None:
            t_in = clock.cpu_now()
        if seq_nr() == self._seq and (len(args) < 2 or args[1] is None):  # args[0]: the optimizer
            if kwargs.get("closure") is None:  # a closure does its own work
                self._take_back(undo)  # stepped together with the optimizer before it
        if self._budget is not None:
            self._own += clock.cpu_now() - t_in

    def _pre_nested(self, optimizer: Any) -> None:
        stepping = self._stepping
        for k, opt in enumerate(stepping):
            if opt is optimizer:  # its last step raised: forget what was under way
                del stepping[k:]
                break
        stepping.append(optimizer)
        if len(stepping) == 1:
            self._undo = None

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if compiling():
            return
        stepping = self._stepping
        if not stepping or stepping[-1] is not optimizer:
            return
        stepping.pop()
        if stepping:
            return
        i = self.i + 1
        if self.now or i >= self._next or i < self._first or self._gen != registry.generation:
            return self._boundary()
        if eager.on:  # it times every iteration
            return self._boundary()
        # the common case: an unrecorded iteration ends, and the next is not recorded either
        self._in.iterations += 1
        self.i = i
        self._undo = _QUICK
        self._seq = seq_nr()
        b = self._budget
        if b is not None:  # its time, and what this hook took of it
            t = clock.cpu_now()
            b.unrecorded.append(t - self._t0)
            b.own.append(self._own)
            self._t0, self._own = t, 0

    def _boundary(self) -> None:
        """An iteration ends and the next begins (every case but the common one)."""
        t_in = clock.cpu_now()
        self._undo = (registry.stratum, *[getattr(self, name) for name in _SAVED])
        self._end()
        self._begin()
        self._seq = seq_nr()
        self._own += clock.cpu_now() - t_in  # this hook's time: the new iteration's

    def _take_back(self, undo: Any) -> None:
        """Undo the last boundary: the step now under way belongs to the iteration before."""
        if undo is _QUICK:
            self.i -= 1
            self._in.iterations -= 1
            b = self._budget
            if b is not None:  # its time was taken too soon
                b.unrecorded.pop()
                b.own.pop()
            return
        self._in.open = 0  # the iteration begun is not one
        eager.take_back()
        current, *values = undo
        for name, value in zip(_SAVED, values):
            setattr(self, name, value)
        if self.demand.on:  # a capture handed over meanwhile stays so; one asked is seen
            self.now = self.now and self.demand.recording()
            self.demand.rewake()
        s = self._in  # the one before has not ended
        s.iterations -= 1
        if self.now:
            s.recorded -= 1
            s.open = 1
        b = self._budget
        if b is not None and self.i >= FIRST:  # its time was taken too soon
            (b.recorded if self.now else b.unrecorded).pop()
            b.own.pop()
        switches.drawn = self.now
        switches.apply()
        eager.drawn(self.now)
        registry.use(current, _stack.thread_stack())

    # -- named iterations -------------------------------------------------------------------
    def enter(self) -> bool:
        """A named iteration begins (its region is entered): whether it is recorded."""
        self._open = True
        self._begin()
        return self.now

    def exit(self) -> None:
        """The named iteration ends: what follows is recorded in full (exact), or on demand
        not at all."""
        i = self.i
        self._end()
        self._open = None
        if self.demand.on:
            self.demand.ended(i)
        self._outside()

    def _outside(self) -> None:
        """Outside named iterations: everything recorded (exact), or nothing on demand."""
        self.now = not self.demand.on
        switches.drawn = self.now
        switches.apply()
        eager.drawn(False)  # outside iterations: compiled code runs compiled
        registry.use(registry.strata[0], _stack.thread_stack())

    def restart(self) -> None:
        """The registry was reset: number iterations from 0 again (the first ones are
        recorded in full again); the iteration under way is iteration 0."""
        self._kept = None
        if self.demand.on:  # what a capture under way held is gone
            self.demand.stop("the registry was reset (registry.reset()) during it", drop=True)
        eager.forget()
        if self._budget is not None:
            self._budget = Budget(self._budget.budget)
        self._undo = None
        self._schedule(0)
        if not (self.on and self.iteration is None):
            self.i = 0
        elif self._stepping:  # reset inside an optimizer step (run's warm-up): 0 begins at its end
            self.i = -1
        else:
            self.i = 0
            self._begin()

    # -- reading ------------------------------------------------------------------------------
    def describe(self) -> Optional[Dict[str, Any]]:
        """What a summary says of the cycle (None when it never drew since the registry was
        reset): the rate, how many iterations were recorded of how many, the budget and
        why the rate is what it is. Read it before the registry's snapshot: it settles
        whether the recorded iteration under way counts yet."""
        strata = registry.strata
        if self.demand.on:  # a capture is exact
            return None
        if self._handles or self._open:
            self._settle()
        if len(strata) < 2 and not self.on or self.last is None:
            return None
        last = self.last
        return {
            "every": self.every if self.on else last["every"],
            "budget": last["budget"],
            "iteration": last["iteration"] or "optimizer step",
            "iterations": sum(s.iterations + s.open for s in strata),
            "recorded": sum(s.recorded + s.open for s in strata),
            "first": FIRST,
            "strata": [
                {
                    "every": s.every,
                    "iterations": s.iterations + s.open,
                    "recorded": s.recorded + s.open,
                }
                for s in strata
            ],
            "why": last["why"],
            "eager": eager.describe(),
        }


def _first_of(handle: Any) -> Any:
    """Make a global optimizer pre-hook run before the others (whether a step is part of the
    iteration before is known before another hook asks whether steps record)."""
    hooks = handle.hooks_dict_ref()
    if hooks is not None and hasattr(hooks, "move_to_end"):
        hooks.move_to_end(handle.id, last=False)
    return handle


# The optimizer hooks' frames, run eagerly inside a compiled step, are not offered to Dynamo.
skip_frame(Cycle._pre)
skip_frame(Cycle._post)
#: The duty cycle of this process.
cycle = Cycle()
