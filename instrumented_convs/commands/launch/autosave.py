"""``run --autosave S``: the run's record (``run.json``, a rank's ``rank<N>.json`` under
torchrun) rewritten every S seconds while the job runs, so that a job killed outright
(SIGKILL, the OOM killer, a node lost) loses at most S seconds of it; the page and the trace
are written at the end only.

The training loop never waits for it: a thread of its own takes the snapshot (as a capture's
writer does), makes the record and writes it whole. A write that fails (a full disk, a folder
that became read-only, a file size limit) is said in one line, the training goes on, and the
next interval tries again. The run's own saves and the autosave never interleave, and none is
written after :meth:`Autosave.stop`.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ...report import RUN_FILE, EntryStats, write_whole
from .runs import job_rank, run_data

__all__ = ["Autosave", "DEFAULT_SECONDS", "autosave_record"]

logger = logging.getLogger(__name__)

#: ``run``'s interval when ``--autosave`` is not given.
DEFAULT_SECONDS = 60.0

#: What an autosave writes: the file and its whole text, made off the loop's thread.
Record = Tuple[Path, str]


class Autosave:
    """Every ``seconds``, ``make()`` (the record as it stands: the file and its text) written
    whole on a daemon thread; :meth:`stop` before the run's own last save. ``lock`` is held
    by each write, and by the run's own saves where they share it."""

    def __init__(self, seconds: float, make: Callable[[int], Record]) -> None:
        self.seconds = seconds
        self.make = make
        self.lock = threading.Lock()
        self.saves = 0  #: autosaves written
        self.longest_s = 0.0  #: the longest one took (snapshot, record and write)
        self._stopped = False
        self._wake = threading.Event()
        self._failed: Optional[str] = None  # the last error said (said again when it changes)
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "Autosave":
        """Start the thread (nothing where ``seconds`` is 0)."""
        if self.seconds > 0:
            self._thread = threading.Thread(
                target=self._loop, name="instrumented_convs autosave", daemon=True
            )
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._wake.wait(self.seconds):
            self.save_once()

    def save_once(self) -> bool:
        """One autosave now (on the calling thread); whether it was written."""
        t0 = time.perf_counter()
        try:
            path, text = self.make(self.saves + 1)
        except Exception:  # noqa: BLE001 - never the training's fault
            logger.warning("run --autosave: the record could not be made", exc_info=True)
            return False
        with self.lock:
            if self._stopped:
                return False
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_whole(path, text)
            except OSError as e:
                why = f"{errno.errorcode.get(e.errno or 0, type(e).__name__)}: {e.strerror or e}"
                if why != self._failed:
                    logger.warning(
                        "run --autosave: %s not written (%s); the training goes on, the next "
                        "autosave in %g s tries again",
                        path,
                        why,
                        self.seconds,
                    )
                self._failed = why
                return False
        if self._failed is not None:
            logger.warning("run --autosave: %s written again", path)
            self._failed = None
        self.saves += 1
        self.longest_s = max(self.longest_s, time.perf_counter() - t0)
        return True

    def stop(self) -> None:
        """No autosave from now on (one under way finishes first): the run's own save is
        the last word."""
        self._wake.set()
        with self.lock:
            self._stopped = True


def autosave_record(
    folder: Path,
    snapshot: Sequence[EntryStats],
    meta: Dict[str, Any],
    by: str = "step",
    unit: Optional[str] = None,
) -> Tuple[Path, str]:
    """What ``run --autosave`` writes: this process's record (``run.json``, or a rank's
    ``rank<N>.json``) and its JSON text, compact (made faster than indented, the loop's
    thread waiting on it the less: docs/performance.md); no other file."""
    rank, world = job_rank()
    data, _ = run_data(snapshot, meta, by, unit, (rank, world))
    return folder / (RUN_FILE if world is None else f"rank{rank}.json"), json.dumps(data)
