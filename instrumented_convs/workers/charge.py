"""Whose work it is: the loader a step of the loading or a batch's copy belongs to, on this
thread. The recorder says which loader is being waited for (its ``__next__`` under way) and
whose batch was handed over last; the loaders' steps (:mod:`.samplers`) and the copies
(:mod:`.copies`) add their time to that loader's record, so that several loaders each get
their own. Imports nothing from the package.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

__all__ = ["state", "own", "waiting", "handed", "copied"]


class _State(threading.local):
    def __init__(self) -> None:
        #: the record of the loader whose ``__next__`` runs on this thread (None: none)
        self.waiting: Any = None
        #: the record of the loader that handed over this thread's last batch
        self.last: Any = None


#: This thread's loaders (see :class:`_State`).
state = _State()


def own(name: str, ns: int) -> None:
    """Add ``ns`` of the step ``name`` to the loader being waited for on this thread (its
    own work in this process, inside its wait), if any."""
    record = state.waiting
    if record is not None:
        record.own[name] = record.own.get(name, 0) + ns


def waiting(record: Any) -> Optional[Any]:
    """Say that ``record``'s loader is being waited for now (None: no longer); returns the
    one said before (a loader waited for inside another's wait)."""
    before, state.waiting = state.waiting, record
    return before


def handed(record: Any) -> None:
    """Say that ``record``'s loader handed over this thread's latest batch: the copies that
    follow, outside any wait, are of its batch."""
    state.last = record


def copied(ns: int) -> None:
    """A batch's copy to its device took ``ns``: the loader's own work inside its wait (DGL
    copies its batch within ``__next__``), else the copy of the batch last handed over."""
    if state.waiting is not None:
        own("copy", ns)
        return
    record = state.last
    if record is not None:
        record.copy += ns
        record.copies += 1
