"""How ``run`` ends when a job is ended: SIGTERM (a scheduler's, to the process or its group)
and Ctrl-C unwind the script as Ctrl-C does, the run is saved, and the process then dies by
the signal as it would have (the default action restored and the signal raised again), so
that torchrun and Slurm see a signal death. While the run is saved a second signal is said
and let pass; a third ends the process at once, naming what was not written.

A script that installs its own SIGINT or SIGTERM handler keeps it: ``signal.signal`` and
``signal.getsignal`` answer for the script's handler while ``run``'s stays installed, and on
the signal ``run`` saves the run as it stands, then calls the script's handler (which may
stop the loop, exit, or let it go on: the run is saved again at its end).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Optional

__all__ = ["Terminated", "Stopping"]

logger = logging.getLogger(__name__)

#: The signals ``run`` answers for: Ctrl-C and a scheduler's end.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(BaseException):
    """Raised in the script's main thread by SIGTERM (as KeyboardInterrupt by SIGINT), so
    that it unwinds and ``run`` saves what it recorded."""


class Stopping:
    """The signals' handling during one ``run``: :meth:`install`, then the script inside
    :meth:`script`, the save (:meth:`saving` naming each part), :meth:`uninstall`, :meth:`die`.

    ``save_now``: called with the signal before a script's own handler runs (the run saved as
    it stands)."""

    def __init__(self, save_now: Callable[[int], None]) -> None:
        self.save_now = save_now
        #: the signal that ended the script (None: it ended by itself)
        self.received: Optional[int] = None
        self._original: Dict[int, Any] = {}
        self._theirs: Dict[int, Any] = {}
        self._installed = False
        self._in_script = False
        self._during_save = 0
        self._saving = "the run"
        self._real_signal = signal.signal
        self._real_getsignal = signal.getsignal
        self._unraisable: Any = None
        self._swallowed = threading.Event()

    # -- during the script ---------------------------------------------------------------

    def install(self) -> bool:
        """Answer SIGINT and SIGTERM from now on (the main thread only: False elsewhere)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in SIGNALS:
            self._original[sig] = self._theirs[sig] = self._real_getsignal(sig)
            self._real_signal(sig, self._on_signal)
        signal.signal, signal.getsignal = self._signal, self._getsignal  # type: ignore[assignment]
        self._unraisable, sys.unraisablehook = sys.unraisablehook, self._on_unraisable
        self._installed = True
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._in_child)
        return True

    def _in_child(self) -> None:
        """A process forked from the script's (a loader's worker, a ``multiprocessing``
        child) gets the handlers the script set, not ``run``'s: it saves no run."""
        if self._installed:
            self.uninstall(to_theirs=True)

    @contextmanager
    def script(self) -> Iterator[None]:
        """Around the script: a signal inside unwinds it; one after it (even in the code
        that ends it here) is one while saving, never an exception."""
        self._in_script = True
        try:
            yield
        finally:
            self._in_script = False

    def _signal(self, sig: Any, handler: Any) -> Any:
        """``signal.signal`` for the script: its SIGINT or SIGTERM handler kept as its own."""
        if sig in self._theirs and threading.current_thread() is threading.main_thread():
            if not (callable(handler) or handler in (signal.SIG_DFL, signal.SIG_IGN)):
                return self._real_signal(sig, handler)  # the TypeError it raises
            previous, self._theirs[sig] = self._theirs[sig], handler
            return previous
        return self._real_signal(sig, handler)

    def _getsignal(self, sig: Any) -> Any:
        """``signal.getsignal`` for the script: its own handler where it set one."""
        return self._theirs[sig] if sig in self._theirs else self._real_getsignal(sig)

    def _on_signal(self, sig: int, frame: Any) -> None:
        """SIGINT or SIGTERM: the script's handler after a save, else its default action as
        an exception that unwinds it (ignored where the script ignores it)."""
        if not self._in_script:
            self._while_saving(sig)
            return
        theirs = self._theirs.get(sig)
        if theirs is signal.SIG_IGN:
            return
        if callable(theirs) and theirs is not signal.default_int_handler:
            try:
                self.save_now(sig)
            except Exception as exc:  # noqa: BLE001 - the script's handler runs whatever
                logger.warning("run: saving the run before the script's handler failed: %s", exc)
            theirs(sig, frame)
            return
        first = self.received is None
        self.received = sig
        if first and sig == signal.SIGTERM:  # (not SIGINT: a script may catch Ctrl-C to end)
            threading.Thread(target=self._again, args=(sig,), daemon=True).start()
        if sig == signal.SIGTERM:
            raise Terminated()
        raise KeyboardInterrupt

    def _again(self, sig: int) -> None:
        """SIGTERM sent again while the script still runs after it: at once where a
        finalizer swallowed its exception, else each second (code that catches it all)."""
        while True:
            quiet = self._swallowed.wait(1.0)
            self._swallowed.clear()
            if not (self._in_script and self._installed):
                return
            if not quiet:
                logger.warning(
                    "run: the script went on after %s: sent again", signal.Signals(sig).name
                )
            os.kill(os.getpid(), sig)

    def _on_unraisable(self, unraisable: Any) -> None:
        """``sys.unraisablehook``: our own Terminated raised inside a finalizer is not printed
        (SIGTERM prints nothing) and is sent again at once; anything else as before."""
        if isinstance(unraisable.exc_value, Terminated) and self._in_script:
            self._swallowed.set()
            return
        self._unraisable(unraisable)

    # -- while saving -------------------------------------------------------------------

    def saving(self, what: str) -> None:
        """Say what is being saved now (a second signal ends the process, naming it)."""
        self._saving = what

    def _while_saving(self, sig: int) -> None:
        self._during_save += 1
        name = signal.Signals(sig).name
        if self._during_save == 1:
            print(
                f"run: {name} while saving {self._saving}: saving goes on "
                f"({name} again to end now, without it)",
                file=sys.stderr,
                flush=True,
            )
            return
        print(f"run: ended by {name} before {self._saving} was written", file=sys.stderr)
        sys.stderr.flush()
        self._default(sig)

    # -- after ---------------------------------------------------------------------------

    def uninstall(self, to_theirs: bool = False) -> None:
        """Give ``signal`` its functions back and the handlers found at :meth:`install` (or,
        ``to_theirs``, those the script set since)."""
        if not self._installed:
            return
        signal.signal, signal.getsignal = self._real_signal, self._real_getsignal  # type: ignore[assignment]
        if sys.unraisablehook == self._on_unraisable:  # (not where the script set its own)
            sys.unraisablehook = self._unraisable
        for sig, handler in (self._theirs if to_theirs else self._original).items():
            self._real_signal(sig, handler)
        self._installed = False

    def die(self) -> None:
        """Where SIGTERM ended the script (or SIGINT where its action was the default's),
        end the process by it as it would have ended; else nothing."""
        sig = self.received
        if sig == signal.SIGTERM or (
            sig == signal.SIGINT and self._original.get(sig, None) is signal.SIG_DFL
        ):
            self._default(sig)

    def _default(self, sig: int) -> None:
        """End this process by ``sig``'s default action, its output flushed first."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
                pass
        self._real_signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os._exit(128 + sig)  # (not reached: the signal's action ends the process)
